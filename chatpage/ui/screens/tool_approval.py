"""ToolApproval: before a tool call runs, the user says y (run it), n (do not: the model is
told) or a (run it, and every later call of this tool in this chat, without asking)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from chatpage.chat.session import ToolRun
from chatpage.ui.text import clean


class ToolApproval(ModalScreen[str]):
    """Dismisses with "y", "n" or "a"."""

    BINDINGS = [
        Binding("y", "answer('y')", "Run it", id="tool_yes"),
        Binding("n,escape", "answer('n')", "Do not run", id="tool_no"),
        Binding("a", "answer('a')", "Always for this tool in this chat", id="tool_always"),
    ]

    def __init__(self, run: ToolRun, chat: str) -> None:
        super().__init__(classes="dialog-screen")
        self.run = run
        self.chat = chat

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm tool-approval"):
            yield Static(
                Text(f"Run the tool {clean(self.run.name)}?", style="bold"), classes="dialog-title"
            )
            yield Static(Text(f"chat: {clean(self.chat)}\narguments: {clean(self.run.arguments)}"))
            yield Static(Text("y run it · n do not · a always for this tool in this chat"))

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)
