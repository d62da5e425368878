"""A chat: persona, messages, sampling settings; the one place prompts are rendered to tokens."""

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


def render_prompt(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True
                  ) -> list[int]:
    """Token ids of ``messages`` through the tokenizer's chat template."""
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer.encode(text, add_special_tokens=False)


def system_prefix(tokenizer, system_prompt: str) -> list[int]:
    """The tokens every conversation with this system prompt starts with (a persona prefix)."""
    return render_prompt(tokenizer, [{"role": "system", "content": system_prompt}],
                         add_generation_prompt=False)


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
