"""SystemPromptEditor: edit one chat's system prompt (ctrl+s saves, escape cancels)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static, TextArea


class SystemPromptEditor(ModalScreen[str | None]):
    """Dismisses with the new system prompt (not empty), or None on escape."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="system_cancel"),
        Binding("ctrl+s", "save", "Save", id="system_save"),
    ]

    def __init__(self, prompt: str, title: str) -> None:
        super().__init__(classes="dialog-screen")
        self.prompt = prompt
        self.title_text = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog system-prompt"):
            yield Static(Text(self.title_text, style="bold"), classes="dialog-title")
            yield TextArea(self.prompt, id="system-text", soft_wrap=True, classes="persona-prompt")
            yield Static("", id="system-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save (ctrl+s)", variant="primary", id="system-save")
                yield Button("Cancel", id="system-cancel")

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()

    @on(Button.Pressed, "#system-save")
    def action_save(self) -> None:
        text = self.query_one(TextArea).text.strip()
        if not text:
            self.query_one("#system-error", Static).update(
                Text("the system prompt is empty; write what the model should be")
            )
            return
        self.dismiss(text)

    @on(Button.Pressed, "#system-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
