"""ListDialog: a modal with a title, an input that filters (or searches) and a list to pick from.

Type to refill the list, up/down to move, enter or a click to pick, escape to cancel. Subclasses
say what the list holds (`options`) and what picking an option returns (`result`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

ResultT = TypeVar("ResultT")


class ListDialog(ModalScreen[ResultT | None], Generic[ResultT]):
    """Dismisses with `result` of the option picked, or None on escape."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="dialog_cancel"),
        Binding("down", "move(1)", "Next", show=False, id="dialog_down"),
        Binding("up", "move(-1)", "Previous", show=False, id="dialog_up"),
    ]

    def __init__(self, title: str, placeholder: str, kind: str, value: str = "") -> None:
        super().__init__(classes="dialog-screen")
        self.title_text = title
        self.placeholder = placeholder
        self.kind = kind
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(classes=f"dialog list-dialog {self.kind}"):
            yield Static(Text(self.title_text, style="bold"), classes="dialog-title")
            yield Input(self.value, placeholder=self.placeholder, id="dialog-input")
            yield OptionList(id="dialog-options")
            yield Static(id="dialog-empty", classes="dialog-note")

    def on_mount(self) -> None:
        self.fill(self.value)
        self.query_one(Input).focus()

    # -- for subclasses ----------------------------------------------------------------------------
    def options(self, text: str) -> list[Option]:
        """The options for what is typed (option ids are what `result` reads)."""
        raise NotImplementedError

    def result(self, option_id: str) -> ResultT | None:
        raise NotImplementedError

    def first(self, shown: list[Option], text: str) -> int:
        """Which of the `shown` options starts highlighted."""
        return 0

    def empty_note(self, text: str) -> str:
        """What to say when `options` found nothing."""
        return "nothing matches"

    # -- the list ----------------------------------------------------------------------------------
    def fill(self, text: str) -> list[Option]:
        shown = self.options(text)
        options = self.query_one(OptionList)
        options.set_options(shown)
        if shown:
            options.highlighted = self.first(shown, text)
        note = self.query_one("#dialog-empty", Static)
        note.update(Text("" if shown else self.empty_note(text)))
        note.display = not shown
        return shown

    @on(Input.Changed, "#dialog-input")
    def _changed(self, event: Input.Changed) -> None:
        self.fill(event.value)

    @on(Input.Submitted, "#dialog-input")
    def _submitted(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            self._pick(options.get_option_at_index(options.highlighted).id)

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self._pick(event.option.id)

    def _pick(self, option_id: str | None) -> None:
        if option_id is not None:
            self.dismiss(self.result(option_id))

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        if options.option_count:
            current = options.highlighted or 0
            options.highlighted = (current + step) % options.option_count

    def action_cancel(self) -> None:
        self.dismiss(None)
