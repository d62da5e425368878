"""A chat's messages after its system prompt, as the chat template wants them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Role = Literal["system", "user", "assistant"]


@dataclass
class Message:
    role: Role
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass
class Conversation:
    """The messages of one chat after its system prompt."""

    system_prompt: str
    messages: list[Message] = field(default_factory=list)

    def for_model(self) -> list[dict[str, str]]:
        """System prompt plus every message, as the chat template wants them."""
        return [{"role": "system", "content": self.system_prompt}] + [
            m.as_dict() for m in self.messages
        ]

    def add(self, role: Role, content: str) -> Message:
        msg = Message(role, content)
        self.messages.append(msg)
        return msg
