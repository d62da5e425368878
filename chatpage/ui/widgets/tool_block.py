"""ToolBlock: one tool call of a reply, folded to a line (its name, state and time) that a
click, or t on the focused message, opens to its arguments and result. Text only, never
markup."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.containers import Vertical
from textual.widgets import Static

from chatpage.chat.entry import ToolRun
from chatpage.ui.text import clean

STATE_NOTES = {
    "asking": "waiting for your answer",
    "running": "running…",
    "done": "done",
    "failed": "failed",
    "denied": "not run",
}


class ToolBlock(Vertical):
    """Shows a `ToolRun`; `redraw` after it changed."""

    def __init__(self, run: ToolRun) -> None:
        super().__init__(classes="tool-block -collapsed")
        self.run = run
        self._head = Static(classes="tool-head")
        self._body = Static(classes="tool-body")
        self.redraw()

    def compose(self):
        yield self._head
        yield self._body

    @property
    def collapsed(self) -> bool:
        return self.has_class("-collapsed")

    def toggle(self) -> None:
        self.set_class(not self.collapsed, "-collapsed")
        self.redraw()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.toggle()

    def redraw(self) -> None:
        run = self.run
        mark = "▸" if self.collapsed else "▾"  # as a thought folds
        took = f" · {run.elapsed_s:.2f} s" if run.resolved and run.elapsed_s else ""
        self._head.update(Text(f"{mark} tool {clean(run.name)} · {STATE_NOTES[run.state]}{took}"))
        body = f"arguments: {clean(run.arguments)}"
        if run.result:
            body += f"\nresult: {clean(run.result)}"
        self._body.update(Text(body))
        self._body.display = not self.collapsed
