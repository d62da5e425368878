"""Thinking split out of a reply: the text between a model's thinking markers (``<think>`` and
``</think>``) is its reasoning, the rest its answer.

The markers are the chat template's own: a template that writes them declares the model thinks
(Qwen3, DeepSeek-R1 and their distills); a template whose generation prompt ends inside an open
marker makes the reply start in thinking. `ThinkSplitter` splits streamed text, holding back
what could still become a marker; `ReasoningFormat.split` splits a whole text (beam rewrites).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MARKERS = (("<think>", "</think>"), ("<thinking>", "</thinking>"))
"""The thinking markers chatpage knows, looked for in a chat template in this order."""


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    """A model's thinking markers."""

    open: str
    close: str

    def splitter(self, prompt_tail: str = "") -> ThinkSplitter:
        """A splitter for a reply to a prompt ending in ``prompt_tail``: it starts in
        thinking when the prompt left a marker open."""
        tail = prompt_tail.rstrip()
        inside = tail.endswith(self.open) or (
            self.open in tail and tail.rfind(self.open) > tail.rfind(self.close)
        )
        return ThinkSplitter(self, inside)

    def split(self, text: str, prompt_tail: str = "") -> tuple[str, str]:
        """(reasoning, answer) of a whole reply."""
        return self.splitter(prompt_tail).feed(text, final=True)


THINKING_SWITCH = re.compile(r"\benable_thinking\b")
"""The chat template variable that turns a model's thinking on or off (Qwen3, GLM and others
name it so)."""


def thinking_switch(chat_template: str | None) -> str | None:
    """The variable of ``chat_template`` that switches thinking, or None: it has none."""
    found = THINKING_SWITCH.search(chat_template or "")
    return found.group(0) if found else None


def reasoning_format(chat_template: str | None) -> ReasoningFormat | None:
    """The thinking markers ``chat_template`` declares, or None for a model that does not
    think."""
    for open_, close in MARKERS:
        if chat_template and open_ in chat_template and close in chat_template:
            return ReasoningFormat(open_, close)
    return None


class ThinkSplitter:
    """Splits one reply's text as it streams."""

    __slots__ = ("fmt", "inside", "_held", "_closed")

    def __init__(self, fmt: ReasoningFormat, inside: bool = False) -> None:
        self.fmt = fmt
        self.inside = inside
        self._held = ""  # text that may be the start of the next marker
        self._closed = False  # thinking just ended: the answer's leading newlines are dropped

    def copy(self) -> ThinkSplitter:
        twin = ThinkSplitter(self.fmt, self.inside)
        twin._held, twin._closed = self._held, self._closed
        return twin

    def _answer(self, piece: str) -> str:
        if self._closed:
            piece = piece.lstrip("\n")
            self._closed = not piece
        return piece

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(new reasoning, new answer) of ``text``, the reply's next piece; ``final``: the
        reply ended (nothing is held back)."""
        text = self._held + text
        self._held = ""
        parts: tuple[list[str], list[str]] = ([], [])
        while text:
            marker = self.fmt.close if self.inside else self.fmt.open
            at = text.find(marker)
            if at < 0:
                keep = 0 if final else partial_marker(text, marker)
                at, self._held = len(text) - keep, text[len(text) - keep :]
            piece = text[:at]
            if self.inside:
                parts[0].append(piece)
            else:
                parts[1].append(self._answer(piece))
            if self._held or at == len(text):
                break
            text = text[at + len(marker) :]
            self.inside = not self.inside
            self._closed = not self.inside  # the answer usually starts after a blank line
        return "".join(parts[0]), "".join(parts[1])


def partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
