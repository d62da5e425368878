"""The chat screen's entries in the command palette: every bound action, personas, open and
saved chats, export and delete. It is handed the screen's controls (`PaletteHost`), not the app."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from textual.app import SystemCommand
from textual.binding import Binding

from chatpage.chat.chats import Chats
from chatpage.chat.session import AltMode, ChatSession
from chatpage.config.personas import Persona
from chatpage.store import SessionRow
from chatpage.store.io import local_time
from chatpage.ui.history import EXPORT_NAMES
from chatpage.ui.text import markup_literal

_MODES = (
    ("Next reply: samples", "ask for the next reply as samples side by side", "samples"),
    ("Next reply: beam search", "ask for the next reply by beam search, beams side by side",
     "beam"),
    ("Next reply: single", "one reply again (alternatives off)", "off"),
)


class PaletteHost(Protocol):
    """What the palette's commands act on (the chat screen)."""

    BINDINGS: Any
    chats: Chats
    personas: list[Persona]
    current: ChatSession | None

    def run_action(self, action: str) -> Any: ...
    def open_session(self, persona: Persona) -> Any: ...
    def open_saved(self, store_id: int) -> Any: ...
    def closed_chats(self) -> list[SessionRow]: ...
    def action_export(self, fmt: str) -> Any: ...
    def action_delete_session(self) -> Any: ...
    def edit_system_prompt(self) -> Any: ...
    def action_switch_persona(self) -> Any: ...
    def action_save_as_persona(self) -> Any: ...


def palette_commands(host: PaletteHost,
                     key_for: Callable[[str], str | None]) -> Iterable[SystemCommand]:
    """Commands for `App.get_system_commands` (titles go through markup: user text is escaped).
    ``key_for`` gives the key of a binding id after the user's keymap."""
    bindings: list[Binding] = host.BINDINGS
    for binding in bindings:
        if binding.id and not binding.id.startswith("goto_session"):
            key = key_for(binding.id) or ""
            yield SystemCommand(binding.description,
                                markup_literal(f"{binding.description} ({key.split(',')[0]})"),
                                lambda action=binding.action: host.run_action(action))
    session = host.current
    if session is not None:
        for title, help_text, kind in _MODES:
            yield SystemCommand(title, help_text, lambda kind=kind: host.chats.set_alt_mode(
                session, AltMode(kind, session.alt_mode.k)))
    yield SystemCommand("Edit this chat's system prompt", "the chat's own system prompt (/system)",
                        host.edit_system_prompt)
    yield SystemCommand("Switch this chat's persona", "continue as another persona (/persona)",
                        host.action_switch_persona)
    yield SystemCommand("Save this chat as a persona", "a persona file of your own, from this "
                        "chat's system prompt and settings (/saveas)", host.action_save_as_persona)
    for persona in host.personas:
        yield SystemCommand(f"New chat: {markup_literal(persona.name)}",
                            markup_literal(persona.description),
                            lambda p=persona: host.open_session(p))
    for i, open_chat in enumerate(host.chats.sessions, 1):
        yield SystemCommand(f"Switch to chat {i}: {markup_literal(open_chat.title)}",
                            f"persona {markup_literal(open_chat.persona.name)}",
                            lambda s=open_chat: setattr(host, "current", s))
    for fmt, name in EXPORT_NAMES.items():
        yield SystemCommand(f"Export chat as {name}",
                            "write this chat to a file in the current folder",
                            lambda fmt=fmt: host.action_export(fmt))
    yield SystemCommand("Delete chat", "delete this chat from the saved chats (asks first)",
                        host.action_delete_session)
    for row in host.closed_chats():
        yield SystemCommand(f"Open saved chat: {markup_literal(row.title)}",
                            f"{row.message_count} messages · {local_time(row.updated_at)} · "
                            f"persona {markup_literal(row.persona)}",
                            lambda sid=row.id: host.open_saved(sid))
