"""A chat's messages after its system prompt, as the chat template wants them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass
class Message:
    """One message; an assistant's may carry ``tool_calls`` (OpenAI's shape), a ``tool``
    message answers the call ``tool_call_id``."""

    role: Role
    content: str
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


@dataclass
class Conversation:
    """The messages of one chat after its system prompt."""

    system_prompt: str
    messages: list[Message] = field(default_factory=list)

    def for_model(self) -> list[dict[str, Any]]:
        """System prompt plus every message, as the chat template wants them."""
        return [{"role": "system", "content": self.system_prompt}] + [
            m.as_dict() for m in self.messages
        ]

    def add(self, role: Role, content: str) -> Message:
        msg = Message(role, content)
        self.messages.append(msg)
        return msg
