"""Response bodies and stream chunks, both ways: `ChunkWriter` (the server's side: outputs ->
vLLM-shaped bodies, whole or as SSE chunks) and `read_choice` / `read_usage` (the client's:
a choice -> an `OutputDelta`, a usage object -> `Usage`), with the SSE framing of both.

Logprobs are OpenAI's two shapes: chat's ``content`` entries with their ``top_logprobs`` list,
and completions' parallel lists, whose ``top_logprobs`` dicts hold the sampled token too (as
vLLM's do). A token is named by its text, or "token_id:N" under vLLM's
return_tokens_as_token_ids; only tokens named by id come back as ids.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from chatpage.engine.outputs import OutputDelta, ToolCall, ToolCallDelta, Usage
from chatpage.vocab import FinishReason, Role
from chatpage.wire.errors import error_body
from chatpage.wire.requests import ApiRequest

TokenText = Callable[[int], str]
TOKEN_ID_PREFIX = "token_id:"
"""How a token is named in logprobs under vLLM's return_tokens_as_token_ids."""
DONE_DATA = "[DONE]"
"""The data of a stream's last event."""
TOOL_CALLS = "tool_calls"
"""The finish reason of a reply that ended in tool calls (OpenAI's)."""


class Output(Protocol):
    """What a body is written from: a delta (`OutputDelta`), or an output whole."""

    @property
    def index(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def logprobs(self) -> Sequence[float] | None: ...
    @property
    def top_logprobs(self) -> Sequence[dict[int, float]] | None: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def reasoning(self) -> str: ...


class WholeOutput(Output, Protocol):
    """An output whole (`CompletionOutput`): with its tool calls."""

    @property
    def tool_calls(self) -> Sequence[ToolCall]: ...


# -- SSE framing --------------------------------------------------------------------------------


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: JSON`` (or the raw text) and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n"


DONE = sse(DONE_DATA)


def sse_error(message: str, status: int = 500) -> str:
    """The event that ends a stream that failed midway."""
    return sse(error_body(message, status))


def sse_data(line: str) -> str | None:
    """The data of one line of a stream (None: a blank, comment or other field's line)."""
    return line[5:].strip() if line.startswith("data:") else None


# -- usage ------------------------------------------------------------------------------------


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def read_usage(raw: Any) -> Usage:
    """`usage_body`'s inverse (fields a server leaves out read as 0)."""
    raw = raw if isinstance(raw, dict) else {}
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(raw.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        completion_tokens=int(raw.get("completion_tokens") or 0),
    )


# -- the server's side --------------------------------------------------------------------------


def token_id_name(token_id: int) -> str:
    """A token as vLLM's return_tokens_as_token_ids names it."""
    return f"{TOKEN_ID_PREFIX}{token_id}"


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    """A call as OpenAI writes it in a message."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def tool_call_delta_body(delta: ToolCallDelta) -> dict[str, Any]:
    """A call's delta as OpenAI streams it: the first with the call's id, type and name."""
    body: dict[str, Any] = {"index": delta.index}
    if delta.id:
        body.update(id=delta.id, type="function")
        body["function"] = {"name": delta.name, "arguments": delta.arguments}
    else:
        body["function"] = {"arguments": delta.arguments}
    return body


class ChunkWriter:
    """The response bodies of one request (``request.kind`` "chat" or "completion"): whole
    (`whole`), or streamed (`chunks` per delta, then `usage_chunk`). ``token_text`` names a
    token by its text (for logprobs and completions' text offsets). Tool calls come as the
    engine read them (`OutputDelta.tool_calls`, `CompletionOutput.tool_calls`)."""

    def __init__(
        self,
        request: ApiRequest,
        response_id: str,
        model: str,
        created: int,
        token_text: TokenText,
    ) -> None:
        self.request = request
        self.chat = request.kind == "chat"
        self.id = response_id
        self.model = model
        self.created = created
        self.token_text = token_text
        self._sent: dict[int, int] = {}  # per streamed choice: the characters sent so far
        self._called: set[int] = set()  # streamed choices that made tool calls

    def _reason(self, reason: str | None, calls: bool) -> str | None:
        if reason is None:
            return None
        return TOOL_CALLS if calls and reason == FinishReason.STOP else str(reason)

    def _head(self, whole: bool) -> dict[str, Any]:
        kind = (
            ("chat.completion" if whole else "chat.completion.chunk")
            if self.chat
            else "text_completion"
        )
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _logprobs(self, out: Output, offset: int) -> Any:
        """The logprobs object of ``out``'s tokens (None when the request did not ask);
        ``offset``: where they start in the choice's text."""
        if not self.request.logprobs:
            return None
        name = token_id_name if self.request.tokens_as_ids else self.token_text
        tokens = [name(t) for t in out.token_ids]
        tops = out.top_logprobs or ()
        steps = [tops[i] if i < len(tops) else {} for i in range(len(tokens))]
        logprobs = out.logprobs or ()
        if self.chat:

            def entry(tok: str, lp: float) -> dict[str, Any]:
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode())}

            return {
                "content": [
                    {**entry(tok, lp), "top_logprobs": [entry(name(t), v) for t, v in top.items()]}
                    for tok, lp, top in zip(tokens, logprobs, steps, strict=False)
                ]
            }
        offsets, at = [], offset
        for t in out.token_ids:  # into the text, whatever the tokens are named
            offsets.append(at)
            at += len(self.token_text(t))
        top_dicts = [
            {**{name(t): v for t, v in top.items()}, tok: lp}
            for tok, lp, top in zip(tokens, logprobs, steps, strict=False)
        ]
        return {
            "tokens": tokens,
            "token_logprobs": list(logprobs),
            "top_logprobs": top_dicts,
            "text_offset": offsets,
        }

    def whole(self, outputs: Iterable[WholeOutput], usage: Usage) -> dict[str, Any]:
        """The answer of a request that was not streamed: every output, whole."""
        choices = []
        for o in sorted(outputs, key=lambda o: o.index):
            logprobs = self._logprobs(o, 0)
            if self.chat:
                text, calls = o.text, o.tool_calls
                message: dict[str, Any] = {
                    "role": str(Role.ASSISTANT),
                    "content": text if text or not calls else None,
                }
                if o.reasoning:
                    message["reasoning_content"] = o.reasoning
                if calls:
                    message["tool_calls"] = [tool_call_body(c) for c in calls]
                choices.append(
                    {
                        "index": o.index,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": self._reason(o.finish_reason, bool(calls)),
                    }
                )
            else:
                choices.append(
                    {
                        "index": o.index,
                        "text": o.text,
                        "logprobs": logprobs,
                        "finish_reason": self._reason(o.finish_reason, False),
                        "stop_reason": None,
                    }
                )
        return {**self._head(True), "choices": choices, "usage": usage_body(usage)}

    def chunks(self, delta: OutputDelta) -> list[dict[str, Any]]:
        """The stream chunks of one delta (a role chunk first for a new chat choice)."""
        out = []
        usage = {"usage": None} if self.request.include_usage else {}
        if delta.index not in self._sent:
            self._sent[delta.index] = 0
            if self.chat:
                out.append(
                    {
                        **self._head(False),
                        "choices": [
                            {
                                "index": delta.index,
                                "delta": {"role": str(Role.ASSISTANT), "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                        **usage,
                    }
                )
        logprobs = self._logprobs(delta, self._sent[delta.index])
        self._sent[delta.index] += len(delta.text)
        if self.chat:
            choice: dict[str, Any] = {"index": delta.index, "delta": self._chat_delta(delta)}
        else:
            choice = {"index": delta.index, "text": delta.text}
        choice.update(
            logprobs=logprobs,
            finish_reason=self._reason(delta.finish_reason, delta.index in self._called),
        )
        out.append({**self._head(False), "choices": [choice], **usage})
        return out

    def _chat_delta(self, delta: OutputDelta) -> dict[str, Any]:
        """A chat choice's delta: new reasoning, new content, and its tool calls' progress."""
        body: dict[str, Any] = {}
        if delta.reasoning:
            body["reasoning_content"] = delta.reasoning
        if delta.text:
            body["content"] = delta.text
        if delta.tool_calls:
            body["tool_calls"] = [tool_call_delta_body(d) for d in delta.tool_calls]
            self._called.add(delta.index)
        return body

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        """The chunk after the last, with the usage (when the request asked for it)."""
        return {**self._head(False), "choices": [], "usage": usage_body(usage)}


# -- the client's side --------------------------------------------------------------------------


def _token_id(token: str) -> int | None:
    """The id in a "token_id:N" name; None for a token named by its text."""
    number = token.removeprefix(TOKEN_ID_PREFIX)
    return int(number) if number != token and number.isdigit() else None


def _read_logprobs(
    raw: Any, chat: bool, count: int
) -> tuple[tuple[int, ...], tuple[float, ...] | None, tuple[dict[int, float], ...] | None]:
    """(token ids, logprobs, alternatives by id) of a choice's ``logprobs``; the ids and the
    alternatives only where the server named every token by id. ``count``: the alternatives
    asked for (completions' dicts also hold the sampled token, dropped if it is not among the
    ``count`` best)."""
    if not isinstance(raw, dict):
        return (), None, None
    if chat:
        content = raw.get("content") or []
        tokens, values = [e["token"] for e in content], [e["logprob"] for e in content]
        alts = [[(a["token"], a["logprob"]) for a in e.get("top_logprobs") or []] for e in content]
    else:
        tokens, values = raw.get("tokens") or [], raw.get("token_logprobs") or []
        alts = [
            sorted((d or {}).items(), key=lambda kv: -kv[1])[:count]
            for d in raw.get("top_logprobs") or [{} for _ in tokens]
        ]
    ids = tuple(i for t in tokens if (i := _token_id(t)) is not None)
    if len(ids) < len(tokens):
        return (), tuple(values), None
    tops = tuple({i: v for t, v in alt if (i := _token_id(t)) is not None} for alt in alts)
    return ids, tuple(values), tops if any(tops) else None


def read_finish_reason(raw: Any) -> FinishReason | None:
    """A choice's finish reason (one chatpage does not know, such as "tool_calls", ends it as
    a stop)."""
    if not raw:
        return None
    try:
        return FinishReason(raw)
    except ValueError:
        return FinishReason.STOP


def read_choice(choice: dict[str, Any], chat: bool, count: int = 0) -> OutputDelta:
    """One choice of a stream chunk (its ``delta``) or of a whole answer (its ``message``), or
    a completion's (its ``text``), as an `OutputDelta`; ``count``: the logprobs alternatives
    the request asked for."""
    if chat:
        part = choice.get("delta") or choice.get("message") or {}
        text = part.get("content") or ""
        reasoning = part.get("reasoning_content") or ""
    else:
        text, reasoning = choice.get("text") or "", ""
    ids, logprobs, tops = _read_logprobs(choice.get("logprobs"), chat, count)
    return OutputDelta(
        index=int(choice.get("index") or 0),
        text=text,
        reasoning=reasoning,
        token_ids=ids,
        logprobs=logprobs,
        top_logprobs=tops,
        finish_reason=read_finish_reason(choice.get("finish_reason")),
    )
