"""StreamingMarkdown: a Markdown widget fed the whole text so far.

Its owner throttles the calls to `show` (`chatpage.ui.widgets.throttle`: at most ~10 a second
while a reply streams); `show` draws on the next message, so the text lands in the same screen
update as the owner's other changes (one layout pass, not one for the owner and one for the text).
If Markdown is still drawing, the running draw picks the latest text up. Appended text goes
through `Markdown.append` (only the last block is re-parsed), rewritten text (beam search reorders
beams) through `Markdown.update`. Raw HTML is not interpreted, and control characters are made
visible (`chatpage.ui.text.clean`).
"""

from __future__ import annotations

from markdown_it import MarkdownIt
from textual.message import Message
from textual.widgets import Markdown

from chatpage.ui.text import clean


def _parser() -> MarkdownIt:
    return MarkdownIt("gfm-like", {"html": False})


class StreamingMarkdown(Markdown):
    """Markdown that keeps up with a stream: appends what is new, coalesces while drawing."""

    class Flushed(Message):
        """New text was drawn (a scrolling container may need to follow it)."""

    def __init__(self, text: str = "", **kwargs) -> None:
        super().__init__(clean(text), parser_factory=_parser, **kwargs)
        self._target = clean(text)
        self._shown = self._target
        self._scheduled = False  # a flush is queued
        self._flushing = False
        self._started = False  # on_mount ran: from then on `show` schedules its own flush

    @property
    def text(self) -> str:
        """The latest text given to `show` (cleaned), whether or not it is drawn yet."""
        return self._target

    def show(self, text: str) -> None:
        """Make ``text`` the content (drawn on the next message)."""
        self._target = clean(text)
        if self._target == self._shown or not self._started or self._scheduled:
            return  # (on_mount, or the queued flush, catches up)
        self._scheduled = True
        self.call_next(self._flush)

    def on_mount(self) -> None:
        # Not `is_mounted`: that turns True only after every mount handler (Markdown's own
        # awaits its first render), and a `show` in between would be dropped.
        self._started = True
        if self._target != self._shown:
            self._scheduled = True
            self.call_next(self._flush)

    async def _flush(self) -> None:
        self._scheduled = False
        if self._flushing:  # the running flush picks the new text up
            return
        self._flushing = True
        try:
            while self._shown != self._target:
                text = self._target
                if self._shown and text.startswith(self._shown):
                    await self.append(text[len(self._shown):])
                else:
                    await self.update(text)
                self._shown = text
        finally:
            self._flushing = False
        self.post_message(self.Flushed())
