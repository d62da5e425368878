"""PersonaEditor: a persona's name, description, greeting, sampling defaults and system prompt.

Saving checks the form with the persona files' own validator (`parse_persona`), so the editor
accepts exactly what a persona file may hold; a problem is shown as one line under the form.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from chatpage.config.personas import SAMPLING_KEYS, InvalidPersona, Persona, parse_persona

_LINES = (("name", "Name"), ("description", "Description"), ("greeting", "Greeting"))
_LABELS = {
    "temperature": "Temperature",
    "top_p": "Top-p",
    "top_k": "Top-k",
    "max_tokens": "Max tokens",
    "seed": "Seed",
}


def _number(raw: str) -> object:
    """What a number field holds: None when empty, an int or float when it reads as one, else
    the text itself (for the validator to reject with its own message)."""
    raw = raw.strip()
    if not raw:
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw


class PersonaEditor(ModalScreen[Persona | None]):
    """Dismisses with the persona as entered (valid), or None on escape."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", id="persona_cancel"),
        Binding("ctrl+s", "save", "Save", id="persona_save"),
    ]

    def __init__(self, persona: Persona, title: str) -> None:
        super().__init__(classes="dialog-screen")
        self.persona = persona
        self.title_text = title

    def compose(self) -> ComposeResult:
        p = self.persona
        with VerticalScroll(classes="dialog persona-editor"):
            yield Static(Text(self.title_text, style="bold"), classes="dialog-title")
            with Grid(classes="settings-grid"):
                for key, label in _LINES:
                    yield Label(label)
                    yield Input(getattr(p, key) or "", id=f"persona-{key}")
            with Grid(classes="settings-grid -two"):
                for key in SAMPLING_KEYS:
                    value = getattr(p, key)
                    yield Label(_LABELS[key])
                    yield Input(
                        "" if value is None else str(value),
                        id=f"persona-{key}",
                        placeholder="unset",
                    )
            yield Label("System prompt")
            yield TextArea(
                p.system_prompt,
                id="persona-system_prompt",
                soft_wrap=True,
                classes="persona-prompt",
            )
            yield Static("", id="persona-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="persona-save")
                yield Button("Cancel", id="persona-cancel")

    def on_mount(self) -> None:
        self.query_one("#persona-name", Input).focus()

    def values(self) -> dict[str, object]:
        """The form as a persona file's mapping (empty optional fields left out)."""
        data: dict[str, object] = {}
        for key, _label in _LINES:
            value = self.query_one(f"#persona-{key}", Input).value
            if value.strip() or key != "greeting":
                data[key] = value
        for key in SAMPLING_KEYS:
            number = _number(self.query_one(f"#persona-{key}", Input).value)
            if number is not None:
                data[key] = number
        data["system_prompt"] = self.query_one("#persona-system_prompt", TextArea).text
        return data

    @on(Button.Pressed, "#persona-save")
    @on(Input.Submitted)
    def action_save(self) -> None:
        try:
            persona = parse_persona(self.values(), Path("<editor>"))
        except InvalidPersona as err:
            self.query_one("#persona-error", Static).update(Text(str(err)))
            return
        self.dismiss(persona)

    @on(Button.Pressed, "#persona-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
