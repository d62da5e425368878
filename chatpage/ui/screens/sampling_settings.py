"""SamplingSettingsScreen: a session's temperature, top-p, top-k, max tokens and seed."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from chatpage.chat.sampling import SETTINGS, SamplingSettings
from chatpage.config.personas import Persona
from chatpage.vocab import SamplingValueError


class SamplingSettingsScreen(ModalScreen[SamplingSettings | None]):
    """Dismisses with the new settings (validated), or None on escape."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="settings_cancel")]

    def __init__(self, current: SamplingSettings, persona: Persona) -> None:
        super().__init__(classes="dialog-screen")
        self.current = current
        self.persona = persona

    def compose(self) -> ComposeResult:
        defaults = SamplingSettings.for_persona(self.persona)
        with Vertical(classes="dialog sampling-settings"):
            yield Static(
                Text(f"Sampling settings · persona {self.persona.name}", style="bold"),
                classes="dialog-title",
            )
            with Grid(classes="settings-grid"):
                for info in SETTINGS:
                    value = getattr(self.current, info.field)
                    default = getattr(defaults, info.field)
                    yield Label(info.label)
                    yield Input(
                        "" if value is None else str(value),
                        id=f"set-{info.field}",
                        placeholder=f"persona: {'off' if default is None else default}",
                        tooltip=info.allowed,
                    )
            yield Static("", id="settings-error", classes="dialog-error")
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="settings-save")
                yield Button("Persona defaults", id="settings-reset")
                yield Button("Cancel", id="settings-cancel")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def _values(self) -> SamplingSettings:
        settings = self.current
        for info in SETTINGS:
            raw = self.query_one(f"#set-{info.field}", Input).value
            settings = settings.with_value(info.field, raw)
        return settings

    @on(Button.Pressed, "#settings-save")
    @on(Input.Submitted)
    def _save(self) -> None:
        try:
            settings = self._values()
        except SamplingValueError as err:
            self.query_one("#settings-error", Static).update(Text(str(err)))
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#settings-reset")
    def _reset(self) -> None:
        defaults = SamplingSettings.for_persona(self.persona)
        for info in SETTINGS:
            value = getattr(defaults, info.field)
            self.query_one(f"#set-{info.field}", Input).value = "" if value is None else str(value)

    @on(Button.Pressed, "#settings-cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
