"""One request to a remote server: sent as `chatpage.wire` writes it for the backend's dialect,
its answer read back by the wire's readers into `RemoteReply`, which turns what arrives into
`RequestUpdate`s."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from typing import Any

import httpx

from chatpage.engine.outputs import OutputDelta, RequestUpdate, Usage, final_update
from chatpage.engine.protocol import UpdateCallback
from chatpage.engine.sampling_params import GrammarKind, SamplingParams
from chatpage.remote.backend import Backend, error_message
from chatpage.vocab import FinishReason
from chatpage.wire.chunks import DONE_DATA, read_choice, read_usage, sse_data
from chatpage.wire.errors import read_error
from chatpage.wire.requests import request_body
from chatpage.wire.tools import ToolRequest

STRUCTURED_OUTPUTS = ("vllm", "chatpage")
"""The backends that read vLLM's structured_outputs (regex, choice, grammar)."""


class RequestFailed(Exception):
    """The server refused or broke off a request; the message is the server's own."""


class Stalled(RequestFailed):
    """The server sent no data for the idle deadline (``backend_timeout``)."""

    def __init__(self, url: str, idle_s: float) -> None:
        super().__init__(
            f"{url} sent nothing for {idle_s:g} s, so the reply was given up; to "
            "wait longer, raise backend_timeout in config.yaml or pass "
            "--backend-timeout SECONDS"
        )


@dataclasses.dataclass
class _Choice:
    num_tokens: int = 0
    finish_reason: FinishReason | None = None


class RemoteReply:
    """The outputs of one request as they arrive; an update per chunk goes to ``on_update``."""

    def __init__(self, request_id: str, on_update: UpdateCallback, t_submit: float) -> None:
        self.request_id = request_id
        self.on_update = on_update
        self.t_submit = t_submit
        self.choices: dict[int, _Choice] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.ttft_s: float | None = None
        self.done = False

    def _usage(self) -> Usage:
        return Usage(
            self.prompt_tokens, self.cached_tokens, sum(c.num_tokens for c in self.choices.values())
        )

    def _open(self) -> list[int]:
        """The choices that have not ended (choice 0 before any arrived)."""
        if not self.choices:
            return [0]
        return [i for i, c in sorted(self.choices.items()) if c.finish_reason is None]

    def add(self, delta: OutputDelta) -> None:
        """New text of one choice (one token, or as many as its logprobs; a finish reason ends
        the choice)."""
        if self.done:
            return
        c = self.choices.setdefault(delta.index, _Choice())
        produced = bool(delta.text or delta.reasoning or delta.tool_calls)
        if produced and self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.t_submit
        count = len(delta.logprobs) if delta.logprobs is not None else int(produced)
        c.num_tokens += count
        c.finish_reason = delta.finish_reason or c.finish_reason
        output = dataclasses.replace(delta, finish_reason=c.finish_reason, num_tokens=count)
        self.on_update(
            RequestUpdate(
                self.request_id,
                (output,),
                self._usage(),
                ttft_s=self.ttft_s,
                elapsed_s=time.monotonic() - self.t_submit,
            )
        )

    def usage(self, usage: Usage) -> None:
        self.prompt_tokens, self.cached_tokens = usage.prompt_tokens, usage.cached_tokens

    def finish(self, reason: FinishReason | None) -> None:
        """Every choice is complete (``reason`` None: those the server left open end STOP),
        or stopped (FinishReason.ABORT)."""
        self._end(reason or FinishReason.STOP, None)

    def fail(self, message: str) -> None:
        self._end(FinishReason.ERROR, message)

    def _end(self, reason: FinishReason, error: str | None) -> None:
        if self.done:
            return
        self.done = True
        self.on_update(
            final_update(
                self.request_id,
                reason,
                self._open(),
                error,
                self._usage(),
                self.ttft_s,
                time.monotonic() - self.t_submit,
            )
        )


def split_samples(backend: Backend, params: SamplingParams) -> list[SamplingParams]:
    """``n`` samples as one request, or as n requests with seeds seed+i where the backend
    answers one sample per request."""
    if params.n == 1 or backend.can("n"):
        return [params]
    seed = params.seed if params.seed is not None else random.randrange(2**31)
    return [dataclasses.replace(params, n=1, seed=seed + i) for i in range(params.n)]


async def run_request(
    http: httpx.AsyncClient,
    backend: Backend,
    reply: RemoteReply,
    kind: str,
    payload: Any,
    params: SamplingParams,
    offset: int,
    idle_s: float,
    tools: ToolRequest | None = None,
) -> None:
    """Send one request (a chat offering ``tools``); its choices arrive in ``reply`` as choices
    ``offset``, ``offset+1``...

    `Stalled` when the server sends no data for ``idle_s`` (no answer at all, or only
    keep-alive comments); `RequestFailed` when the stream ends before the reply does."""
    if params.use_beam_search and not backend.can("beam"):
        raise RequestFailed(
            f"{backend.label} has no beam search (vLLM has; SGLang started with "
            "--enable-beam-search); ask for samples instead"
        )
    structured = params.structured
    if (
        structured is not None
        and backend.name not in STRUCTURED_OUTPUTS
        and (structured.kind not in (GrammarKind.JSON_SCHEMA, GrammarKind.JSON_OBJECT))
    ):
        raise RequestFailed(
            f"{backend.label} takes no {structured.kind} grammar (vLLM's structured_outputs); "
            "only a JSON schema or JSON object (response_format) can be sent to it"
        )
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    body = request_body(backend.model, kind, payload, params, backend.dialect, tools)
    chat = kind != "completion"
    try:
        async with asyncio.timeout(idle_s) as quiet:
            if not body["stream"]:  # beam search: the final beams, at once
                r = await http.post(path, json=body)
                _check(r, backend)
                data = r.json()
                for choice in data.get("choices", []):
                    delta = read_choice(choice, chat, params.top_logprobs)
                    reply.add(
                        dataclasses.replace(
                            delta,
                            index=offset + delta.index,
                            finish_reason=delta.finish_reason or FinishReason.STOP,
                        )
                    )
                reply.usage(read_usage(data.get("usage")))
                return
            async with http.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    _check(r, backend)
                if await _read_stream(r, backend, reply, quiet, idle_s, chat, params, offset):
                    return
    except (TimeoutError, httpx.ReadTimeout):  # whichever notices the silence first
        raise Stalled(backend.url, idle_s) from None
    raise RequestFailed(
        f"{backend.label} at {backend.url} ended the stream before the reply "
        "was finished (no finish reason, no [DONE]); the text so far is kept"
    )


async def _read_stream(
    r: httpx.Response,
    backend: Backend,
    reply: RemoteReply,
    quiet: asyncio.Timeout,
    idle_s: float,
    chat: bool,
    params: SamplingParams,
    offset: int,
) -> bool:
    """Read the SSE stream into ``reply``, each data line putting the ``quiet`` deadline off by
    ``idle_s``; whether the stream said the reply is over ([DONE], or every choice finished)."""
    loop = asyncio.get_running_loop()
    finished: set[int] = set()
    async for line in r.aiter_lines():
        data = sse_data(line)
        if data is None:  # a keep-alive comment or a blank line is not progress
            continue
        quiet.reschedule(loop.time() + idle_s)
        if data == DONE_DATA:
            return True
        chunk = json.loads(data)
        if "error" in chunk:
            raise RequestFailed(f"{backend.label}: {read_error(chunk)}")
        if chunk.get("usage"):
            reply.usage(read_usage(chunk["usage"]))
        for choice in chunk.get("choices") or []:
            delta = read_choice(choice, chat, params.top_logprobs)
            reply.add(dataclasses.replace(delta, index=offset + delta.index))
            if delta.finish_reason is not None:
                finished.add(delta.index)
    return finished >= set(range(params.n))


def _check(response: httpx.Response, backend: Backend) -> None:
    if response.status_code != 200:
        raise RequestFailed(
            f"{backend.label} answered {response.status_code}: {error_message(response)}"
        )
