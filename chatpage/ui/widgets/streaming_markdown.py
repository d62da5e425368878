"""StreamingMarkdown: a Markdown widget fed the engine's deltas.

`add` queues a delta's text (appended) or, for a rewrite (beam search reorders beams), the text
that replaces the content; nothing is derived from the whole text. Its owner throttles the calls
to `draw` (`chatpage.ui.widgets.throttle`: at most ~10 a second while a reply streams); `draw`
works on the next message, so the text lands in the same screen update as the owner's other
changes (one layout pass, not one for the owner and one for the text). If Markdown is still
drawing, the running draw picks up what was queued meanwhile. Appended text goes through
`Markdown.append` (only the last block is re-parsed), a replacement through `Markdown.update`.
Raw HTML is not interpreted, and control characters are made visible (`chatpage.ui.text.clean`).
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
        self._appended = ""  # queued to append, after the replacement if there is one
        self._replacement: str | None = None
        self._scheduled = False  # a flush is queued
        self._flushing = False
        self._started = False  # on_mount ran: from then on `draw` schedules its own flush

    def add(self, text: str, rewrite: bool = False) -> None:
        """Queue ``text`` to append, or (``rewrite``) to replace the content; drawn by `draw`."""
        if rewrite:
            self._replacement, self._appended = clean(text), ""
        else:
            self._appended += clean(text)

    def draw(self) -> None:
        """Draw what `add` queued (on the next message)."""
        if not self._queued or not self._started or self._scheduled:
            return  # (on_mount, or the queued flush, catches up)
        self._scheduled = True
        self.call_next(self._flush)

    @property
    def _queued(self) -> bool:
        return bool(self._appended) or self._replacement is not None

    def on_mount(self) -> None:
        # Not `is_mounted`: that turns True only after every mount handler (Markdown's own
        # awaits its first render), and a `draw` in between would be dropped.
        self._started = True
        self.draw()

    async def _flush(self) -> None:
        self._scheduled = False
        if self._flushing:  # the running flush picks the new text up
            return
        self._flushing = True
        try:
            while self._queued:
                replacement, appended = self._replacement, self._appended
                self._replacement, self._appended = None, ""
                if replacement is not None:
                    await self.update(replacement + appended)
                else:
                    await self.append(appended)
        finally:
            self._flushing = False
        self.post_message(self.Flushed())
