"""The app's saved chats: the store opened at start, chats restored, reopened, exported, deleted.

Closing a chat (ctrl+w) only closes it: it stays saved, in search and in `chatpage history`, and
is not reopened at the next start (search or the palette's "Open saved chat" bring it back).
"Delete chat" (command palette) removes it from the store, after a confirmation. A chat's
unsent draft is saved with it and comes back with it.

`SavedChats` gets what it works on (the store, the open chats, a way to say things); it knows
nothing of the screens that ask it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from chatpage.chat.chats import Chats
from chatpage.chat.recorder import Recorder
from chatpage.chat.saved import load_session, restore
from chatpage.chat.session import ChatSession
from chatpage.config.paths import data_dir
from chatpage.config.personas import Persona
from chatpage.store import SessionRow, Store
from chatpage.store.io import export_session, write_whole

EXPORT_SUFFIX = {"md": "md", "json": "json"}
EXPORT_NAMES = {"md": "Markdown", "json": "JSON"}
REOPEN_LIMIT = 20
"""How many closed chats the command palette offers to open again."""

Say = Callable[..., None]
"""``say(message, severity="information", timeout=None)``: a one-line notice."""


class SavedChats:
    """The store behind the open chats: `start` at mount, `stop` at quit."""

    def __init__(self, store: Store, chats: Chats, say: Say) -> None:
        self.store = store
        self.chats = chats
        self.say = say
        self.recorder = Recorder(store, report=lambda line: say(line, "error", timeout=12))
        chats.observers.append(self.recorder)

    def start(self, personas: list[Persona], fallback: Persona) -> list[ChatSession]:
        """Say what went wrong opening the store, and return the chats that were open last
        time (most recent first), their drafts back in place."""
        if self.store.notice:
            self.say(self.store.notice, "warning", timeout=20)
        try:
            sessions, notes = restore(self.store, personas, fallback, self.chats.next_id)
            for session in sessions:
                if session.store_id is not None:  # (restored: always)
                    session.draft = self.store.draft(session.store_id)
        except Exception as err:  # a store that fails here must not stop the app
            self.say(f"could not restore the saved chats: {err}", "error", timeout=20)
            return []
        for note in notes:
            self.say(note, "warning")
        return sessions

    def stop(self) -> None:
        """At quit: drafts and replies in progress are saved (replies as interrupted), and the
        store is closed."""
        recorder = self.recorder
        for session in self.chats.sessions:
            self.save_draft(session)
        recorder.finish()
        for observers in [self.chats.observers, *(s.observers for s in self.chats.sessions)]:
            if recorder in observers:
                observers.remove(recorder)
        self.store.close()

    def save_draft(self, session: ChatSession) -> None:
        """Keep ``session.draft`` in the store (a chat with no message yet is saved for it)."""
        self.recorder.keep_draft(session)

    def save_persona(self, session: ChatSession) -> None:
        """Keep the name of the persona ``session`` continues with (once it is saved), and
        its system prompt is that persona's again."""
        if session.store_id is not None:
            self.store.update_session(session.store_id, persona=session.persona.name)
            self.recorder.keep_system_prompt(session, own=False)

    def save_system_prompt(self, session: ChatSession) -> None:
        """Keep the system prompt set for ``session`` alone (/system), across restarts."""
        self.recorder.keep_system_prompt(session, own=True)

    def closed_chats(self) -> list[SessionRow]:
        """Saved chats not open now, most recent first (at most REOPEN_LIMIT)."""
        open_ids = {s.store_id for s in self.chats.sessions}
        rows = [r for r in self.store.list_sessions() if r.id not in open_ids]
        return rows[:REOPEN_LIMIT]

    def find_open(self, store_id: int) -> ChatSession | None:
        return next((s for s in self.chats.sessions if s.store_id == store_id), None)

    def reopen(
        self, store_id: int, personas: list[Persona], fallback: Persona
    ) -> ChatSession | None:
        """The saved chat ``store_id`` loaded again (not yet adopted), or None if it is gone or
        cannot be read (said either way)."""
        row = self.store.get_session(store_id)
        if row is None:
            self.say("that chat is no longer saved", "warning")
            return None
        session, note = load_session(self.store, row, personas, fallback, self.chats.next_id)
        if note:
            self.say(note, "warning" if session else "error")
        if session is None:
            return None
        session.draft = self.store.draft(store_id)
        self.store.set_closed(store_id, False)
        return session

    def export(self, session: ChatSession, fmt: str) -> Path | None:
        """Write ``session`` as Markdown or JSON to a new file in the working directory (or
        the data dir when that cannot be written), and say where."""
        if session.store_id is None:
            self.say("there is nothing to export yet: send a message first", "warning")
            return None
        self.recorder.flush(force=True)
        text = export_session(self.store, session.store_id, fmt)  # type: ignore[arg-type]
        name = export_name(session.title, session.store_id, fmt)
        problems = []
        for folder in (Path.cwd(), data_dir() / "exports"):
            try:
                path = write_new(folder, name, text)
            except OSError as err:
                problems.append(f"{folder}: {err.strerror or err}")
                continue
            self.say(f"exported the chat as {EXPORT_NAMES[fmt]} to {path}")
            return path
        self.say(f"could not export the chat: {'; '.join(problems)}", "error")
        return None

    def delete(self, session: ChatSession) -> None:
        """Remove ``session`` from the store (the caller closes it)."""
        self.recorder.delete(session)


def export_name(title: str, store_id: int, fmt: str) -> str:
    """``chatpage-12-how-does-paging-work-20240501-1430.md``: the chat's id, its title as a
    safe slug, the local time."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.casefold()).strip("-")[:40].strip("-") or "chat"
    stamp = datetime.now().strftime("%Y%m%d-%H%M")
    return f"chatpage-{store_id}-{slug}-{stamp}.{EXPORT_SUFFIX[fmt]}"


def write_new(folder: Path, name: str, text: str) -> Path:
    """Write ``text`` to a file that did not exist (``name``, else ``name-2``...) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    stem, dot, suffix = name.rpartition(".")
    for n in range(1, 1000):
        path = folder / (name if n == 1 else f"{stem}-{n}{dot}{suffix}")
        try:
            write_whole(path, text, replace=False)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"too many exports named {name}")
