"""Helpers shared by test modules (instead of test modules importing each other).

Chat model: a persona, a client that records what it is asked (the chat model's tests need
no engine), and engine events to feed back.
"""

from __future__ import annotations

from chatpage.config.personas import Persona
from chatpage.engine.client import StreamEvent

PERSONA = Persona("p", "a persona", "You are p.", temperature=0.5, max_tokens=8)


class FakeClient:
    """Stands in for `EngineClient` in chat-model tests: records submits and cancels; the
    test feeds events back with `Chats.apply`. Request ids are r1, r2, ..."""

    error = None
    ready = True

    def __init__(self, max_model_len: int = 0) -> None:
        self.max_model_len = max_model_len
        self.submitted: list[tuple[list, object, object]] = []
        self.continued: list[bool] = []
        self.cancelled: list[str] = []

    def submit(self, messages, params, on_event, *, continue_reply: bool = False) -> str:
        self.submitted.append((messages, params, on_event))
        self.continued.append(continue_reply)
        return f"r{len(self.submitted)}"

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


def event(rid: str, text: str, index: int = 0, finished: bool = False, reason: str | None = None,
          request_finished: bool | None = None, **kw) -> StreamEvent:
    """An event of request `rid` with `text` so far (one token per character)."""
    return StreamEvent(rid, index, text, "", False, len(text), finished, reason,
                       kw.get("logprob", -1.0), kw.get("score"),
                       finished if request_finished is None else request_finished,
                       kw.get("prompt_tokens", 20), 16, 0.1, 0.5, kw.get("error"))


def done(rid: str, text: str, **kw) -> StreamEvent:
    """The last event of a plain reply that finished normally."""
    return event(rid, text, finished=True, reason="stop", **kw)


def stopped(rid: str, text: str) -> StreamEvent:
    """The client's notice that request `rid` was cancelled (no counts)."""
    return StreamEvent(rid, 0, text, "", False, 0, True, "abort", 0.0, None, True, 0, 0, None, 1.0)
