"""The chat screen's entries in the command palette: every action's entries (from the table of
actions), then the personas, the open chats and the saved ones. It is handed the screen's
controls (`PaletteHost`), not the app."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from textual.app import SystemCommand

from chatpage.chat.chats import Chats
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.store.io import local_time
from chatpage.ui.actions.action import Action
from chatpage.ui.actions.table import ACTIONS
from chatpage.ui.history import SavedChats
from chatpage.ui.text import markup_literal


class PaletteHost(Protocol):
    """What the palette's commands act on (the chat screen)."""

    chats: Chats
    personas: list[Persona]
    current: ChatSession | None
    saved: SavedChats

    def act(self, action: Action, arg: str | None = None) -> Awaitable[None]: ...
    def open_session(self, persona: Persona) -> Any: ...
    def open_saved(self, store_id: int) -> Any: ...


def palette_commands(
    host: PaletteHost, key_for: Callable[[str], str | None]
) -> Iterable[SystemCommand]:
    """Commands for `App.get_system_commands` (titles go through markup: user text is escaped).
    ``key_for`` gives the key of a binding id after the user's keymap."""
    for action in ACTIONS:
        for entry in action.palette_entries(key_for):
            yield SystemCommand(
                markup_literal(entry.title),
                markup_literal(entry.help),
                lambda a=action, arg=entry.arg: host.act(a, arg),
            )
    for persona in host.personas:
        yield SystemCommand(
            f"New chat: {markup_literal(persona.name)}",
            markup_literal(persona.description),
            lambda p=persona: host.open_session(p),
        )
    for i, open_chat in enumerate(host.chats.sessions, 1):
        yield SystemCommand(
            f"Switch to chat {i}: {markup_literal(open_chat.title)}",
            f"persona {markup_literal(open_chat.persona.name)}",
            lambda s=open_chat: setattr(host, "current", s),
        )
    for row in host.saved.closed_chats():
        yield SystemCommand(
            f"Open saved chat: {markup_literal(row.title)}",
            f"{row.message_count} messages · {local_time(row.updated_at)} · "
            f"persona {markup_literal(row.persona)}",
            lambda sid=row.id: host.open_saved(sid),
        )
