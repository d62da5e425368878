"""Incremental detokenization with stop strings.

Never emits half a UTF-8 character (a trailing U+FFFD is held back until the next token resolves
it) and never shows any part of a stop string: text that could still turn into one is held back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chatpage.engine.text.tokenizer import TextTokenizer

# how many tokens before the read offset are re-decoded for context (spaces, merges)
_CONTEXT = 6


class IncrementalDetokenizer:
    """Turns one sequence's output tokens into text, step by step."""

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: list[int], stop: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # all decoded output text (stop string excluded once found)
        self.emitted = 0  # how much of the visible text `take` has handed out
        # offsets into the sequence's full token list
        self.prefix_offset = max(len(prompt_ids) - _CONTEXT, 0)
        self.read_offset = len(prompt_ids)

    def copy(self) -> IncrementalDetokenizer:
        twin = IncrementalDetokenizer.__new__(IncrementalDetokenizer)
        twin.__dict__.update(self.__dict__)
        return twin

    def update(self, all_ids: list[int], final: bool = False) -> bool:
        """Decode the tokens appended since the last call; True if a stop string was reached.
        ``final``: no token follows, so an incomplete character is decoded as it stands (its
        U+FFFD, as decoding the whole output gives), not held back."""
        decode = self.tokenizer.decode
        prefix = decode(all_ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full = decode(all_ids[self.prefix_offset :], skip_special_tokens=True)
        if (full.endswith("\ufffd") and not final) or len(full) <= len(prefix):
            return False  # an incomplete character, or nothing visible yet
        new = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(all_ids)
        start = max(len(self.text) - self._holdback, 0)
        self.text += new
        for s in self.stop:
            hit = self.text.find(s, start)
            if hit != -1:
                self.text = self.text[:hit]
                return True
        return False

    def _visible_end(self, finished: bool) -> int:
        if finished or not self._holdback:
            return len(self.text)
        return max(len(self.text) - self._holdback, 0)

    def visible(self, finished: bool) -> str:
        """The text safe to show: all of it when finished, else minus a possible stop prefix."""
        return self.text[: self._visible_end(finished)]

    def take(self, finished: bool) -> str:
        """The visible text that is new since the last call: the step's delta. (Visible text
        only grows: a stop string is found at or after the part held back.)"""
        end = self._visible_end(finished)
        delta, self.emitted = self.text[self.emitted : end], end
        return delta
