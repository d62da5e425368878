"""The app's entries in the command palette: every bound action, personas, open and saved chats,
export and delete."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from textual.app import SystemCommand

from chatpage.store.io import local_time
from chatpage.ui.history import EXPORT_NAMES, closed_chats
from chatpage.ui.text import markup_literal

if TYPE_CHECKING:
    from chatpage.ui.app import ChatApp

_MODES = (
    ("Next reply: samples", "ask for the next reply as samples side by side", "samples"),
    ("Next reply: beam search", "ask for the next reply by beam search, beams side by side",
     "beam"),
    ("Next reply: single", "one reply again (alternatives off)", "off"),
)


def palette_commands(app: ChatApp) -> Iterable[SystemCommand]:
    """Commands for `App.get_system_commands` (titles go through markup: user text is escaped)."""
    for binding in app.BINDINGS:
        if binding.id and not binding.id.startswith("goto_session"):
            key = app.key_for(binding.id) or ""
            yield SystemCommand(binding.description,
                                markup_literal(f"{binding.description} ({key.split(',')[0]})"),
                                lambda action=binding.action: app.run_action(action))
    for title, help_text, kind in _MODES:
        yield SystemCommand(title, help_text, lambda kind=kind: app.set_alt_mode(kind))
    for persona in app.personas:
        yield SystemCommand(f"New chat: {markup_literal(persona.name)}",
                            markup_literal(persona.description),
                            lambda p=persona: app.call_next(app.open_session, p))
    for i, session in enumerate(app.chats.sessions, 1):
        yield SystemCommand(f"Switch to chat {i}: {markup_literal(session.title)}",
                            f"persona {markup_literal(session.persona.name)}",
                            lambda s=session: app.switch_to(s))
    for fmt, name in EXPORT_NAMES.items():
        yield SystemCommand(f"Export chat as {name}",
                            "write this chat to a file in the current folder",
                            lambda fmt=fmt: app.action_export(fmt))
    yield SystemCommand("Delete chat", "delete this chat from the saved chats (asks first)",
                        app.action_delete_session)
    for row in closed_chats(app):
        yield SystemCommand(f"Open saved chat: {markup_literal(row.title)}",
                            f"{row.message_count} messages · {local_time(row.updated_at)} · "
                            f"persona {markup_literal(row.persona)}",
                            lambda sid=row.id: app.open_saved(sid))
