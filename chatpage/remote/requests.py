"""One request to a remote server: the body (every sampling field explicit, named per backend),
the SSE reader, and `RemoteReply`, which turns what arrives into `RequestUpdate`s."""

from __future__ import annotations

import dataclasses
import json
import random
import time
from typing import Any

import httpx

from chatpage.engine.outputs import (
    FinishReason,
    OutputDelta,
    RequestUpdate,
    Usage,
    final_update,
)
from chatpage.engine.protocol import UpdateCallback
from chatpage.engine.sampling_params import SamplingParams
from chatpage.remote.backend import TOP_K_OFF, Backend, error_message


class RequestFailed(Exception):
    """The server refused or broke off a request; the message is the server's own."""


TOKEN_ID_PREFIX = "token_id:"
"""How a token is named in logprobs under vLLM's return_tokens_as_token_ids."""
TOKENS_BY_ID = ("vllm", "chatpage")  # backends that take return_tokens_as_token_ids


@dataclasses.dataclass
class Logprobs:
    """The per-token logprobs a chunk of one choice brought (OpenAI's chat or completions
    shape), with the tokens as ids where the server named them so (else None)."""

    token_ids: list[int | None]
    logprobs: list[float]
    top_logprobs: list[dict[int, float]]  # per token: the asked-for best, by id

    @classmethod
    def read(cls, raw: Any, completion: bool, count: int) -> Logprobs | None:
        """Parse a choice's ``logprobs`` (None: there are none); ``count``: the alternatives
        asked for (completions' dicts also hold the sampled token, dropped if it is not among
        the ``count`` best)."""
        if not isinstance(raw, dict):
            return None
        if completion:
            tokens, values = raw.get("tokens") or [], raw.get("token_logprobs") or []
            alts = [sorted((d or {}).items(), key=lambda kv: -kv[1])[:count]
                    for d in raw.get("top_logprobs") or [{} for _ in tokens]]
        else:
            content = raw.get("content") or []
            tokens, values = [e["token"] for e in content], [e["logprob"] for e in content]
            alts = [[(a["token"], a["logprob"]) for a in e.get("top_logprobs") or []]
                    for e in content]
        tops = [{_token_id(t): v for t, v in alt if _token_id(t) is not None} for alt in alts]
        return cls([_token_id(t) for t in tokens], list(values), tops)

    def delta_fields(self) -> dict[str, Any]:
        """OutputDelta's token_ids, logprobs and top_logprobs: ids and alternatives only
        where the server named every token by id."""
        ids = tuple(t for t in self.token_ids if t is not None)
        named = bool(self.logprobs) and len(ids) == len(self.token_ids)
        return {"token_ids": ids if named else (),
                "logprobs": tuple(self.logprobs) if self.logprobs else None,
                "top_logprobs": tuple(self.top_logprobs) if named and any(self.top_logprobs)
                else None}


def _token_id(token: str) -> int | None:
    """The id in a "token_id:N" name; None for a token named by its text."""
    number = token.removeprefix(TOKEN_ID_PREFIX)
    return int(number) if number != token and number.isdigit() else None


@dataclasses.dataclass
class _Choice:
    num_tokens: int = 0
    finish_reason: FinishReason | None = None


def _finish_reason(raw: str | None) -> FinishReason | None:
    """A server's finish reason; one chatpage has no name for (e.g. "tool_calls") is a STOP."""
    if not raw:
        return None
    try:
        return FinishReason(raw)
    except ValueError:
        return FinishReason.STOP


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
        return Usage(self.prompt_tokens, self.cached_tokens,
                     sum(c.num_tokens for c in self.choices.values()))

    def _open(self) -> list[int]:
        """The choices that have not ended (choice 0 before any arrived)."""
        if not self.choices:
            return [0]
        return [i for i, c in sorted(self.choices.items()) if c.finish_reason is None]

    def add(self, index: int, delta: str, finish_reason: str | None,
            logprobs: Logprobs | None = None) -> None:
        """New text for choice ``index`` (one token, or those ``logprobs`` lists; a finish
        reason ends the choice)."""
        if self.done:
            return
        c = self.choices.setdefault(index, _Choice())
        if delta and self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.t_submit
        count = len(logprobs.logprobs) if logprobs is not None else int(bool(delta))
        c.num_tokens += count
        c.finish_reason = _finish_reason(finish_reason) or c.finish_reason
        carried = logprobs.delta_fields() if logprobs is not None else {}
        output = OutputDelta(index, delta, finish_reason=c.finish_reason, num_tokens=count,
                             **carried)
        self.on_update(RequestUpdate(self.request_id, (output,), self._usage(),
                                     ttft_s=self.ttft_s,
                                     elapsed_s=time.monotonic() - self.t_submit))

    def usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        self.cached_tokens = int(details.get("cached_tokens") or 0)

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
        self.on_update(final_update(self.request_id, reason, self._open(), error, self._usage(),
                                    self.ttft_s, time.monotonic() - self.t_submit))


def split_samples(backend: Backend, params: SamplingParams) -> list[SamplingParams]:
    """``n`` samples as one request, or as n requests with seeds seed+i where the backend
    answers one sample per request."""
    if params.n == 1 or backend.can("n"):
        return [params]
    seed = params.seed if params.seed is not None else random.randrange(2**31)
    return [dataclasses.replace(params, n=1, seed=seed + i) for i in range(params.n)]


def request_body(backend: Backend, kind: str, payload, params: SamplingParams) -> dict[str, Any]:
    """Every sampling field sent explicitly: servers fill unset ones from the model's
    generation config, which would make a reply differ from what the user set."""
    beam = params.use_beam_search
    body: dict[str, Any] = {
        "model": backend.model, "max_tokens": params.max_tokens, "stop": params.stop,
        "n": params.width, "temperature": 0.0 if beam else params.temperature,
        "top_p": 1.0 if beam else params.top_p, "stream": not beam,
    }
    body["messages" if kind != "completion" else "prompt"] = payload
    if kind == "continue":  # vLLM's names (chatpage serve and SGLang read them too)
        body.update(continue_final_message=True, add_generation_prompt=False)
    if not beam:
        body["stream_options"] = {"include_usage": True}
    if params.seed is not None:
        body["seed"] = params.seed
    if params.logprobs is not None:
        if kind == "completion":
            body["logprobs"] = params.logprobs
        else:
            body.update(logprobs=True, top_logprobs=params.logprobs)
        if backend.name in TOKENS_BY_ID:  # alternatives come back by id, not as text
            body["return_tokens_as_token_ids"] = True
    top_k = params.top_k if params.top_k > 0 else TOP_K_OFF[backend.name]
    if top_k is not None and not beam:
        body["top_k"] = top_k
    if backend.can("vllm_extras"):
        body.update(stop_token_ids=params.stop_token_ids, ignore_eos=params.ignore_eos)
        if beam:
            body.update(use_beam_search=True, length_penalty=params.length_penalty)
    return body


async def run_request(http: httpx.AsyncClient, backend: Backend, reply: RemoteReply, kind: str,
                      payload, params: SamplingParams, offset: int) -> None:
    """Send one request; its choices arrive in ``reply`` as choices ``offset``, ``offset+1``..."""
    if params.use_beam_search and not backend.can("beam"):
        raise RequestFailed(f"{backend.label} has no beam search (vLLM has; SGLang started with "
                            "--enable-beam-search); ask for samples instead")
    path = "/v1/completions" if kind == "completion" else "/v1/chat/completions"
    body = request_body(backend, kind, payload, params)
    if not body["stream"]:  # beam search: the final beams, at once
        r = await http.post(path, json=body)
        _check(r, backend)
        data = r.json()
        for choice in data.get("choices", []):
            text = choice["text"] if kind == "completion" else choice["message"]["content"]
            reply.add(offset + choice["index"], text or "", choice.get("finish_reason") or "stop",
                      Logprobs.read(choice.get("logprobs"), kind == "completion",
                                    params.top_logprobs))
        reply.usage(data.get("usage") or {})
        return
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            await r.aread()
            _check(r, backend)
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise RequestFailed(f"{backend.label}: {chunk['error'].get('message')}")
            if chunk.get("usage"):
                reply.usage(chunk["usage"])
            for choice in chunk.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content") if kind != "completion" \
                    else choice.get("text")
                reply.add(offset + choice.get("index", 0), delta or "",
                          choice.get("finish_reason"),
                          Logprobs.read(choice.get("logprobs"), kind == "completion",
                                        params.top_logprobs))


def _check(response: httpx.Response, backend: Backend) -> None:
    if response.status_code != 200:
        raise RequestFailed(f"{backend.label} answered {response.status_code}: "
                            f"{error_message(response)}")
