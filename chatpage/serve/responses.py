"""Response bodies shaped as vLLM's OpenAI server writes them (whole and as stream chunks)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from chatpage.engine.outputs import CompletionOutput, OutputDelta
from chatpage.serve.bridge import RequestStream

TokenText = Callable[[int], str]


class Shaper:
    """Builds the bodies of one request: ``kind`` "chat" or "completion"."""

    def __init__(self, stream: RequestStream, response_id: str, model: str, created: int,
                 token_text: TokenText) -> None:
        self.stream = stream
        self.chat = stream.request.kind == "chat"
        self.id = response_id
        self.model = model
        self.created = created
        self.token_text = token_text
        self._opened: set[int] = set()

    def _head(self, whole: bool) -> dict[str, Any]:
        kind = ("chat.completion" if whole else "chat.completion.chunk") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def usage(self) -> dict[str, Any]:
        s = self.stream
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.completion_tokens,
                "total_tokens": s.prompt_tokens + s.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": s.cached_tokens}}

    def _logprobs(self, token_ids: Sequence[int], logprobs: Sequence[float] | None,
                  tops: Sequence[dict[int, float]] | None, offset: int) -> Any:
        """OpenAI's logprobs object of these tokens (None when the request did not ask):
        chat's ``content`` entries with their ``top_logprobs`` list, or completions' parallel
        lists, whose ``top_logprobs`` dicts hold the sampled token too (as vLLM's do)."""
        if not self.stream.request.logprobs:
            return None
        logprobs, tops = logprobs or (), tops or ()
        text = _token_id_text if self.stream.request.tokens_as_ids else self.token_text
        tokens = [text(t) for t in token_ids]
        steps = [tops[i] if i < len(tops) else {} for i in range(len(tokens))]
        if self.chat:
            def entry(tok: str, lp: float) -> dict[str, Any]:
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode())}

            return {"content": [
                {**entry(tok, lp), "top_logprobs": [entry(text(t), v) for t, v in top.items()]}
                for tok, lp, top in zip(tokens, logprobs, steps, strict=False)
            ]}
        offsets, at = [], offset
        for t in token_ids:  # into the text, whatever the tokens are named
            offsets.append(at)
            at += len(self.token_text(t))
        top_dicts = [{**{text(t): v for t, v in top.items()}, tok: lp}
                     for tok, lp, top in zip(tokens, logprobs, steps, strict=False)]
        return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": top_dicts,
                "text_offset": offsets}

    # -- whole responses ---------------------------------------------------------------------------
    def whole(self) -> dict[str, Any]:
        choices = [self._choice(o) for _, o in sorted(self.stream.outputs.items())]
        return {**self._head(True), "choices": choices, "usage": self.usage()}

    def _choice(self, o: CompletionOutput) -> dict[str, Any]:
        logprobs = self._logprobs(o.token_ids, o.logprobs, o.top_logprobs, 0)
        if self.chat:
            return {"index": o.index, "message": {"role": "assistant", "content": o.text},
                    "logprobs": logprobs, "finish_reason": o.finish_reason}
        return {"index": o.index, "text": o.text, "logprobs": logprobs,
                "finish_reason": o.finish_reason, "stop_reason": None}

    # -- stream chunks -----------------------------------------------------------------------------
    def chunks(self, update: OutputDelta) -> list[str]:
        """SSE ``data:`` lines for one delta (a role chunk first for a new chat choice)."""
        out = []
        usage = {"usage": None} if self.stream.request.include_usage else {}
        if self.chat and update.index not in self._opened:
            self._opened.add(update.index)
            out.append(_sse({**self._head(False), "choices": [{
                "index": update.index, "delta": {"role": "assistant", "content": ""},
                "logprobs": None, "finish_reason": None}], **usage}))
        sent = self.stream.outputs[update.index]
        offset = len(sent.text) - len(update.text)
        logprobs = self._logprobs(update.token_ids, update.logprobs, update.top_logprobs,
                                  offset)
        if self.chat:
            delta = {"content": update.text} if update.text else {}
            choice = {"index": update.index, "delta": delta}
        else:
            choice = {"index": update.index, "text": update.text}
        choice.update(logprobs=logprobs, finish_reason=update.finish_reason)
        out.append(_sse({**self._head(False), "choices": [choice], **usage}))
        return out

    def usage_chunk(self) -> str:
        return _sse({**self._head(False), "choices": [], "usage": self.usage()})


def _token_id_text(token_id: int) -> str:
    """A token as vLLM's return_tokens_as_token_ids names it."""
    return f"token_id:{token_id}"


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


def sse_error(message: str, status: int = 500) -> str:
    return _sse({"error": {"message": message, "type": "InternalServerError", "param": None,
                           "code": status}})


DONE = "data: [DONE]\n\n"
