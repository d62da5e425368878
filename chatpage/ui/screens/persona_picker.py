"""PersonaPicker: choose the persona of a new chat (type to filter, enter to pick)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets.option_list import Option

from chatpage.config.personas import Persona
from chatpage.ui.screens.list_dialog import ListDialog
from chatpage.ui.text import one_line


class PersonaPicker(ListDialog[Persona]):
    """Dismisses with the chosen persona, or None on escape."""

    def __init__(
        self,
        personas: list[Persona],
        preferred: Persona | None = None,
        title: str = "New chat: choose a persona",
    ) -> None:
        super().__init__(title, "filter personas", "persona-picker")
        self.personas = personas
        self.preferred = preferred

    def first(self, shown: list[Option], text: str) -> int:
        ids = [o.id for o in shown]
        preferred = self.preferred.name if self.preferred is not None else None
        return ids.index(preferred) if not text and preferred in ids else 0

    def options(self, text: str) -> list[Option]:
        needle = text.casefold().strip()
        return [
            self._option(p)
            for p in self.personas
            if not needle or needle in p.name.casefold() or needle in p.description.casefold()
        ]

    def result(self, option_id: str) -> Persona | None:
        return next((p for p in self.personas if p.name == option_id), None)

    def empty_note(self, text: str) -> str:
        return "no persona matches"

    @staticmethod
    def _option(persona: Persona) -> Option:
        text = Text(one_line(persona.name, 40), style="bold")
        text.append(f"\n  {one_line(persona.description, 70)}", style="italic")
        return Option(text, id=persona.name)
