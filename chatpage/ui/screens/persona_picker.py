"""PersonaPicker: choose the persona of a new chat (type to filter, enter to pick)."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from chatpage.personas import Persona
from chatpage.ui.text import one_line


class PersonaPicker(ModalScreen[Persona | None]):
    """Dismisses with the chosen persona, or None on escape."""

    BINDINGS = [
        Binding("escape", "dismiss_picker", "Cancel", id="picker_cancel"),
        Binding("down", "move(1)", "Next", show=False, id="picker_down"),
        Binding("up", "move(-1)", "Previous", show=False, id="picker_up"),
    ]

    def __init__(self, personas: list[Persona], preferred: Persona | None = None) -> None:
        super().__init__(classes="dialog-screen")
        self.personas = personas
        self.preferred = preferred

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog persona-picker"):
            yield Static(Text("New chat: choose a persona", style="bold"), classes="dialog-title")
            yield Input(placeholder="filter personas", id="persona-filter")
            yield OptionList(id="persona-options")

    def on_mount(self) -> None:
        self._fill("")
        options = self.query_one(OptionList)
        if self.preferred is not None and self.preferred.name in [o.id for o in options.options]:
            options.highlighted = options.get_option_index(self.preferred.name)
        self.query_one(Input).focus()

    def _fill(self, needle: str) -> None:
        needle = needle.casefold().strip()
        options = self.query_one(OptionList)
        shown = [p for p in self.personas
                 if not needle or needle in p.name.casefold() or needle in p.description.casefold()]
        options.set_options(self._option(p) for p in shown)
        if shown:
            options.highlighted = 0

    @staticmethod
    def _option(persona: Persona) -> Option:
        text = Text(one_line(persona.name, 40), style="bold")
        text.append(f"\n  {one_line(persona.description, 70)}", style="italic")
        return Option(text, id=persona.name)

    @on(Input.Changed, "#persona-filter")
    def _filter(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#persona-filter")
    def _submit(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            self._pick(options.get_option_at_index(options.highlighted).id)

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self._pick(event.option.id)

    def _pick(self, name: str | None) -> None:
        self.dismiss(next((p for p in self.personas if p.name == name), None))

    def action_move(self, step: int) -> None:
        options = self.query_one(OptionList)
        if options.option_count:
            current = options.highlighted or 0
            options.highlighted = (current + step) % options.option_count

    def action_dismiss_picker(self) -> None:
        self.dismiss(None)
