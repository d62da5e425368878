"""One request to a remote server: sent as `chatpage.wire` writes it for the backend's dialect,
its answer read back by the wire's readers into `RemoteReply`, which turns what arrives into
`StreamEvent`s."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Any

import httpx

from chatpage.engine.client import EventCallback, StreamEvent
from chatpage.engine.outputs import OutputDelta, Usage
from chatpage.engine.sampling_params import SamplingParams
from chatpage.remote.backend import Backend, error_message
from chatpage.vocab import FinishReason
from chatpage.wire.chunks import DONE_DATA, read_choice, read_usage, sse_data
from chatpage.wire.errors import read_error
from chatpage.wire.requests import request_body


class RequestFailed(Exception):
    """The server refused or broke off a request; the message is the server's own."""


@dataclasses.dataclass
class _Choice:
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    token_ids: list[int] = dataclasses.field(default_factory=list)  # named by id, with logprobs
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[dict[int, float]] = dataclasses.field(default_factory=list)

    def logprob_fields(self) -> dict[str, Any]:
        """StreamEvent's token_ids, logprobs and top_logprobs (fresh lists): ids and
        alternatives only where the server named every token by id."""
        named = bool(self.logprobs) and len(self.token_ids) == len(self.logprobs)
        return {"token_ids": list(self.token_ids) if named else None,
                "logprobs": list(self.logprobs) if self.logprobs else None,
                "top_logprobs": list(self.top_logprobs) if named and any(self.top_logprobs)
                else None}


class RemoteReply:
    """The outputs of one request as they arrive; emits events to ``on_event``."""

    def __init__(self, request_id: str, on_event: EventCallback, t_submit: float) -> None:
        self.request_id = request_id
        self.on_event = on_event
        self.t_submit = t_submit
        self.choices: dict[int, _Choice] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.ttft_s: float | None = None
        self.done = False

    def _event(self, index: int, delta: str, finished: bool, reason: str | None,
               request_finished: bool, error: str | None = None, counted: bool = True
               ) -> StreamEvent:
        c = self.choices.get(index, _Choice())
        return StreamEvent(
            request_id=self.request_id, index=index, text=c.text, delta=delta, replaced=False,
            num_tokens=c.num_tokens if counted else 0, finished=finished, finish_reason=reason,
            cumulative_logprob=0.0, score=None, request_finished=request_finished,
            prompt_tokens=self.prompt_tokens, prefix_hit_tokens=self.cached_tokens,
            ttft_s=self.ttft_s, elapsed_s=time.monotonic() - self.t_submit, error=error,
            num_outputs=max(len(self.choices), 1), **c.logprob_fields())

    def add(self, delta: OutputDelta) -> None:
        """New text of one choice (one token, or as many as its logprobs; a finish reason ends
        the choice)."""
        if self.done:
            return
        index = delta.index
        c = self.choices.setdefault(index, _Choice())
        if delta.text and self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.t_submit
        c.text += delta.text
        if delta.logprobs is not None:
            c.num_tokens += len(delta.logprobs)
            c.token_ids += delta.token_ids
            c.logprobs += delta.logprobs
            c.top_logprobs += delta.top_logprobs or [{} for _ in delta.logprobs]
        elif delta.text:
            c.num_tokens += 1
        if delta.finish_reason:
            c.finish_reason = delta.finish_reason
        self.on_event(self._event(index, delta.text, c.finish_reason is not None,
                                  c.finish_reason, False))

    def usage(self, usage: Usage) -> None:
        self.prompt_tokens, self.cached_tokens = usage.prompt_tokens, usage.cached_tokens

    def finish(self, reason: str | None) -> None:
        """Every choice is complete (``reason`` None), or stopped ("abort")."""
        if self.done:
            return
        self.done = True
        for index in sorted(self.choices) or [0]:
            c = self.choices.get(index, _Choice())
            final = reason or c.finish_reason or "stop"
            self.on_event(self._event(index, "", True, final, True, counted=reason is None))

    def fail(self, message: str) -> None:
        if self.done:
            return
        self.done = True
        for index in sorted(self.choices) or [0]:
            self.on_event(self._event(index, "", True, "error", True, message, counted=False))


def split_samples(backend: Backend, params: SamplingParams) -> list[SamplingParams]:
    """``n`` samples as one request, or as n requests with seeds seed+i where the backend
    answers one sample per request."""
    if params.n == 1 or backend.can("n"):
        return [params]
    seed = params.seed if params.seed is not None else random.randrange(2**31)
    return [dataclasses.replace(params, n=1, seed=seed + i) for i in range(params.n)]


async def run_request(http: httpx.AsyncClient, backend: Backend, reply: RemoteReply, kind: str,
                      payload, params: SamplingParams, offset: int) -> None:
    """Send one request; its choices arrive in ``reply`` as choices ``offset``, ``offset+1``..."""
    if params.use_beam_search and not backend.can("beam"):
        raise RequestFailed(f"{backend.label} has no beam search (vLLM has; SGLang started with "
                            "--enable-beam-search); ask for samples instead")
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    body = request_body(backend.model, kind, payload, params, backend.dialect)
    chat = kind != "completion"
    if not body["stream"]:  # beam search: the final beams, at once
        r = await http.post(path, json=body)
        _check(r, backend)
        data = r.json()
        for choice in data.get("choices", []):
            delta = read_choice(choice, chat, params.top_logprobs)
            reply.add(dataclasses.replace(delta, index=offset + delta.index,
                                         finish_reason=delta.finish_reason or FinishReason.STOP))
        reply.usage(read_usage(data.get("usage")))
        return
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            _check(r, backend)
        async for line in r.aiter_lines():
            data = sse_data(line)
            if data is None:
                continue
            if data == DONE_DATA:
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RequestFailed(f"{backend.label}: {read_error(chunk)}")
            if chunk.get("usage"):
                reply.usage(read_usage(chunk["usage"]))
            for choice in chunk.get("choices") or []:
                delta = read_choice(choice, chat, params.top_logprobs)
                reply.add(dataclasses.replace(delta, index=offset + delta.index))


def _check(response: httpx.Response, backend: Backend) -> None:
    if response.status_code != 200:
        raise RequestFailed(f"{backend.label} answered {response.status_code}: "
                            f"{error_message(response)}")
