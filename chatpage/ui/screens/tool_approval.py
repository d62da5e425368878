"""ToolApproval: before a tool call runs, the user says y (run it), n or escape (do not: the
model is told), or a and then enter (run it, and every later call of this server's tool in
this chat, without asking).

It never takes typing meant for the message box. It answers only a key pressed after
`ToolApproval.QUIET_S` without a key (since it opened, or since the last key): the keys before
that, typing that went on as it opened, go on to the message box, and so does any other
letter. "Always" takes two keys, each after its quiet moment.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Static

from chatpage.chat.entry import ToolRun
from chatpage.chat.mcp import McpTool
from chatpage.ui.text import clean
from chatpage.ui.widgets.prompt_input import is_chord

TYPING_KEYS = ("backspace",)
"""Keys that are typing, besides the printable ones: passed on to the message box."""


def tool_label(run: ToolRun, tool: McpTool | None) -> str:
    """``server/tool`` (the tool alone where no offered tool has its name)."""
    return run.name if tool is None else f"{tool.server}/{tool.name}"


class ToolApproval(ModalScreen[str]):
    """Dismisses with "y", "n" or "a". ``forward`` takes the typing it passes on."""

    QUIET_S = 0.5
    """How long no key must have come before a key answers."""

    def __init__(
        self, run: ToolRun, tool: McpTool | None, chat: str, forward: Callable[[events.Key], object]
    ) -> None:
        super().__init__(classes="dialog-screen")
        self.run = run
        self.tool = tool
        self.chat = chat
        self.forward = forward
        self.always = False  # "a" was pressed: enter confirms, escape goes back
        self._quiet_from = time.monotonic()
        self._keys = Static(id="tool-approval-keys")
        self._timer: Timer | None = None  # draws the keys bold once they answer

    def compose(self) -> ComposeResult:
        server = f"MCP server {self.tool.server}" if self.tool else "no server offers it"
        with Vertical(classes="dialog confirm tool-approval"):
            yield Static(
                Text(f"Run the tool {clean(self.run.name)} ({clean(server)})?", style="bold"),
                classes="dialog-title",
            )
            yield Static(Text(f"chat: {clean(self.chat)}\narguments: {clean(self.run.arguments)}"))
            yield self._keys

    def on_mount(self) -> None:
        self._quiet_from = time.monotonic()
        self._show_keys()

    @property
    def answering(self) -> bool:
        """Whether the next key answers (no key came for `QUIET_S`)."""
        return time.monotonic() - self._quiet_from >= self.QUIET_S

    def _show_keys(self) -> None:
        label = clean(tool_label(self.run, self.tool))
        if self.always:
            keys = f"Always run {label} in this chat, without asking? enter: yes · escape: back"
        else:
            keys = f"y run it · n do not · a always run {label} in this chat"
        self._keys.update(Text(keys, style="bold" if self.answering else "dim"))
        if self._timer is not None:
            self._timer.stop()
        self._timer = None if self.answering else self.set_timer(self.QUIET_S, self._show_keys)

    def on_key(self, event: events.Key) -> None:
        event.stop()
        event.prevent_default()
        key, answering = event.key, self.answering
        self._quiet_from = time.monotonic()
        if answering and self._answered(key):
            return
        if (event.is_printable or key in TYPING_KEYS) and not is_chord(key):
            self.forward(events.Key(key, event.character))
        self._show_keys()

    def _answered(self, key: str) -> bool:
        """Act on ``key`` as an answer (or a step of "always"); False: it is not one."""
        if self.always:
            if key == "enter":
                self.dismiss("a")
                return True
            if key not in ("escape", "n"):
                return False
            self.always = False
        elif key in ("y", "n", "escape"):
            self.dismiss("n" if key == "escape" else key)
            return True
        elif key == "a":
            self.always = True
        else:
            return False
        self._show_keys()
        return True
