"""ThoughtFold: a reply's (or an alternative's) thinking, folded under one line ("thought for
212 tokens"; while the model thinks, "thinking… 40 tokens", live). A click on the line, or alt+t
(the action table's ``toggle_thinking``, for replies), opens or folds it. The thinking is the
model's text: shown as plain text, its control characters made visible, never as markup."""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from chatpage.chat.entry import Entry
from chatpage.chat.session import Candidate
from chatpage.ui.text import clean


def fold_line(entry: Entry | Candidate, expanded: bool) -> str:
    """The one line a reply's thinking folds under."""
    n = entry.reasoning_tokens
    tokens = f"{n} token{'s' if n != 1 else ''}"
    return f"{'▾' if expanded else '▸'} " + (
        f"thinking… {tokens}" if entry.still_thinking else f"thought for {tokens}"
    )


class ThoughtFold(Vertical):
    """The thinking of ``entry`` (hidden while it has none); `draw` after it changed."""

    DEFAULT_CSS = """
    ThoughtFold { height: auto; }
    ThoughtFold .thought-line { color: $text-muted; text-style: italic; }
    ThoughtFold .thought-body { color: $text-muted; padding: 0 0 0 2; }
    """

    def __init__(self, entry: Entry | Candidate) -> None:
        super().__init__(classes="thought")
        self.entry = entry
        self.expanded = False
        self._line = Static(classes="thought-line")
        self._body = Static(classes="thought-body")
        self._shown = ""  # the thinking the body shows
        self.draw()

    def compose(self) -> ComposeResult:
        yield self._line
        yield self._body

    def draw(self) -> None:
        self.display = bool(self.entry.reasoning)
        if not self.display:
            return
        line = fold_line(self.entry, self.expanded)
        if self._line.content != line:
            self._line.update(Text(line))
        self._body.display = self.expanded
        if self.expanded and self._shown != self.entry.reasoning:
            self._shown = self.entry.reasoning
            self._body.update(Text(clean(self._shown.strip())))

    def toggle(self) -> None:
        self.expanded = not self.expanded
        self.draw()

    @on(events.Click, ".thought-line")
    def _clicked(self, event: events.Click) -> None:
        event.stop()
        self.toggle()
