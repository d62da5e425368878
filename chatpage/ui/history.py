"""The app's saved chats: the store opened at start, chats restored, reopened, exported, deleted.

Closing a chat (ctrl+w) only closes it: it stays saved, in search and in `chatpage history`, and
is not reopened at the next start (search or the palette's "Open saved chat" bring it back).
"Delete chat" (command palette) removes it from the store, after a confirmation.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from chatpage.chat.recorder import SAVE_INTERVAL_S, Recorder, load_session, restore
from chatpage.chat.session import ChatSession
from chatpage.config.paths import data_dir
from chatpage.store import SearchHit, SessionRow, Store
from chatpage.store.io import export_session
from chatpage.ui.screens.chat_search import ChatSearch
from chatpage.ui.screens.confirm import Confirm

if TYPE_CHECKING:
    from chatpage.ui.app import ChatApp

EXPORT_SUFFIX = {"md": "md", "json": "json"}
EXPORT_NAMES = {"md": "Markdown", "json": "JSON"}
REOPEN_LIMIT = 20
"""How many closed chats the command palette offers to open again."""


def start(app: ChatApp) -> list[ChatSession]:
    """Open the store (unless the app was given one), hook the recorder up, say what went wrong,
    and return the chats that were open last time (most recent first)."""
    if app.store is None:
        app.store = Store.open()
    store = app.store
    if store.notice:
        app.say(store.notice, "warning", timeout=20)
    if not store.persistent:
        app.gauge.saving = f"not saving: {store.fault or 'chats are kept in memory only'}"
    app.recorder = Recorder(store, report=lambda line: app.say(line, "error", timeout=12))
    app.chats.observers.append(app.recorder)
    app.set_interval(SAVE_INTERVAL_S / 2, app.recorder.flush)
    try:
        sessions, notes = restore(store, app.personas, app.default_persona(), app.chats.next_id)
    except Exception as err:  # a store that fails here must not stop the app
        app.say(f"could not restore the saved chats: {err}", "error", timeout=20)
        return []
    for note in notes:
        app.say(note, "warning")
    return sessions


def stop(app: ChatApp) -> None:
    """At quit: replies in progress are saved as interrupted, and the store is closed."""
    recorder = app.recorder
    if recorder is not None:
        recorder.finish()
        for observers in [app.chats.observers, *(s.observers for s in app.chats.sessions)]:
            if recorder in observers:
                observers.remove(recorder)
    if app.store is not None:
        app.store.close()


def closed_chats(app: ChatApp) -> list[SessionRow]:
    """Saved chats not open now, most recent first (at most REOPEN_LIMIT)."""
    if app.store is None:
        return []
    open_ids = {s.store_id for s in app.chats.sessions}
    rows = [r for r in app.store.list_sessions() if r.id not in open_ids]
    return rows[:REOPEN_LIMIT]


def open_saved(app: ChatApp, store_id: int) -> ChatSession | None:
    """Switch to the saved chat ``store_id``, opening it (again) if needed."""
    for session in app.chats.sessions:
        if session.store_id == store_id:
            app.switch_to(session)
            return session
    row = app.store.get_session(store_id) if app.store is not None else None
    if row is None:
        app.say("that chat is no longer saved", "warning")
        return None
    session, note = load_session(app.store, row, app.personas, app.default_persona(),
                                 app.chats.next_id)
    if note:
        app.say(note, "warning")
    app.store.set_closed(store_id, False)
    app.add_session(session)
    app.switch_to(session)
    return session


def search(app: ChatApp, term: str = "") -> None:
    """The search dialog; the hit picked opens its chat."""
    if app.store is None:
        return

    def picked(hit: SearchHit | None) -> None:
        if hit is not None:
            open_saved(app, hit.session_id)

    app.push_screen(ChatSearch(app.store.search, term), picked)


def export(app: ChatApp, fmt: str) -> Path | None:
    """Write the current chat as Markdown or JSON to a new file in the working directory (or
    the data dir when that cannot be written), and say where."""
    session = app.current
    if session is None or app.store is None or app.recorder is None:
        return None
    if session.store_id is None:
        app.say("there is nothing to export yet: send a message first", "warning")
        return None
    app.recorder.flush(force=True)
    text = export_session(app.store, session.store_id, fmt)  # type: ignore[arg-type]
    name = export_name(session.title, session.store_id, fmt)
    problems = []
    for folder in (Path.cwd(), data_dir() / "exports"):
        try:
            path = write_new(folder, name, text)
        except OSError as err:
            problems.append(f"{folder}: {err.strerror or err}")
            continue
        app.say(f"exported the chat as {EXPORT_NAMES[fmt]} to {path}")
        return path
    app.say(f"could not export the chat: {'; '.join(problems)}", "error")
    return None


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
            with path.open("x", encoding="utf-8") as out:
                out.write(text)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"too many exports named {name}")


def delete(app: ChatApp) -> None:
    """Ask, then delete the current chat from the store and close it."""
    session = app.current
    if session is None:
        return

    async def answered(yes: bool | None) -> None:
        if yes and session in app.chats.sessions:
            app.recorder.delete(session)
            await app.close_session(session)
            app.say(f"deleted the chat {session.title!r}")

    saved = "It is removed from the saved chats; this cannot be undone." \
        if session.store_id is not None else "It has no messages yet."
    app.push_screen(Confirm(f"Delete the chat {session.title!r}?", saved, "Delete"), answered)
