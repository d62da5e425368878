"""Confirm: ask before doing something destructive. Cancel has the focus, so enter (a key typed
in a burst) cancels; y or the action's button goes ahead."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from chatpage.ui.text import clean


class Confirm(ModalScreen[bool]):
    """Dismisses with True to go ahead, False to cancel."""

    BINDINGS = [
        Binding("escape,n", "answer(False)", "Cancel", id="confirm_cancel"),
        Binding("y", "answer(True)", "Yes", show=False, id="confirm_yes"),
    ]

    def __init__(self, question: str, detail: str, action: str) -> None:
        super().__init__(classes="dialog-screen")
        self.question = question
        self.detail = detail
        self.action = action

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog confirm"):
            yield Static(Text(clean(self.question), style="bold"), classes="dialog-title")
            yield Static(Text(clean(self.detail)))
            with Horizontal(classes="dialog-buttons"):
                yield Button(self.action, variant="error", id="confirm-yes")
                yield Button("Cancel", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
