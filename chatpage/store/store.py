"""SQLite persistence for chats: sessions, messages (a tree of branches), full-text search.

The database is ``data_dir()/chatpage.db`` (WAL mode, schema versioned by ``PRAGMA user_version``).
Messages form a tree (`chatpage.store.tree`): siblings are the versions of one turn, and the kept
one at each fork makes the active path, the transcript on show.

A chat the user closed keeps its messages (``closed = 1``): it stays in the history, search and
exports, and the app leaves it out of the chats it reopens at start.

Faults never stop the app: a corrupt database is moved aside and a new one started; a database
that cannot be written is replaced by an in-memory one. Either way `Store.notice` says so.
The schema and the opening rules are in `chatpage.store.schema`, the export and import formats
in `chatpage.store.io`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatpage.config.paths import data_dir
from chatpage.store.rows import NewMessage, NotFound, SearchHit, SessionRow
from chatpage.store.schema import inserted_id, open_database, transaction
from chatpage.store.tree import ACTIVE_PATH, ROLES, STATUSES, MessageTree, check, now

DB_NAME = "chatpage.db"
SNIPPET_MARKS = ("«", "»")
"""Put around the matched words in `SearchHit.snippet`."""


def make_title(first_user_message: str, limit: int = 40) -> str:
    """A session title from the first user message: its first non-empty line, whitespace
    collapsed, cut at a word boundary to at most `limit` characters with an ellipsis."""
    line = next((ln for ln in first_user_message.splitlines() if ln.strip()), "")
    title = " ".join(line.split())
    if not title:
        return "New chat"
    if len(title) <= limit:
        return title
    cut = title[: limit - 1]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" .,;:-") + "…"


def _fts_query(term: str) -> str:
    """User text -> an FTS5 query that cannot be a syntax error: every word a quoted phrase
    (all must match), the last one also as a prefix so search works while typing."""
    words = [w for w in term.replace("\x00", "").split() if any(c.isalnum() for c in w)]
    quoted = ['"' + word.replace('"', '""') + '"' for word in words]
    return " ".join(quoted) + " *" if quoted else ""


class Store(MessageTree):
    """The chat database. Use `Store.open()`; call it from one thread (the UI's)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        persistent: bool,
        notice: str | None = None,
        fault: str | None = None,
    ) -> None:
        self._conn = conn
        conn.row_factory = sqlite3.Row
        self.path = path
        self._persistent = persistent
        self.notice = notice
        """One line for the user when something went wrong opening the database, else None."""
        self.fault = fault
        """Why chats are not saved, in a few words (None while `persistent`)."""

    @classmethod
    def open(cls, path: Path | None = None) -> Store:
        """Open (creating, migrating) the database at `path` (default data_dir()/chatpage.db).

        Never raises for a bad file: a corrupt or unreadable one is moved aside and a fresh one
        started; an unwritable location gives an in-memory store. `notice` then says what happened.
        """
        path = Path(path) if path is not None else data_dir() / DB_NAME
        opened = open_database(path)
        return cls(
            opened.conn,
            path,
            persistent=opened.persistent,
            notice=opened.notice,
            fault=opened.fault,
        )

    @property
    def persistent(self) -> bool:
        """False when chats live only in memory (see `notice`)."""
        return self._persistent

    def close(self) -> None:
        """Close the connection; the store cannot be used afterwards."""
        self._conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- sessions --------------------------------------------------------------------------

    def create_session(
        self, title: str, persona: str, settings: dict[str, Any] | None = None
    ) -> int:
        """Add an empty chat and return its id."""
        stamp = now()
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, persona, json.dumps(settings or {}), stamp, stamp),
            )
        return inserted_id(cur)

    _SESSION_SELECT = (
        "SELECT s.*, (" + ACTIVE_PATH.format(session="s.id") + "SELECT COUNT(*) FROM path) "
        "AS message_count FROM sessions s "
    )

    def list_sessions(self, closed: bool | None = None) -> list[SessionRow]:
        """Chats, most recently updated first: all of them, or only the closed (True) or the
        open (False) ones."""
        where = "" if closed is None else f"WHERE s.closed = {int(closed):d} "
        rows = self._conn.execute(
            self._SESSION_SELECT + where + "ORDER BY s.updated_at DESC, s.id DESC"
        )
        return [SessionRow.from_row(row) for row in rows]

    def get_session(self, session_id: int) -> SessionRow | None:
        """The chat with this id, or None."""
        row = self._conn.execute(self._SESSION_SELECT + "WHERE s.id = ?", (session_id,)).fetchone()
        return None if row is None else SessionRow.from_row(row)

    def update_session(
        self,
        session_id: int,
        *,
        title: str | None = None,
        persona: str | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        """Change a chat's title, persona and/or settings (None = leave as is); NotFound if
        there is no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            for column, value in (
                ("title", title),
                ("persona", persona),
                ("settings", None if settings is None else json.dumps(settings)),
            ):
                if value is not None:
                    conn.execute(
                        f"UPDATE sessions SET {column} = ? WHERE id = ?", (value, session_id)
                    )

    def rename_session(self, session_id: int, title: str) -> None:
        """Set a chat's title; NotFound if there is no such chat."""
        self.update_session(session_id, title=title)

    def set_closed(self, session_id: int, closed: bool) -> None:
        """Mark a chat closed (kept, but not reopened at start) or open again; NotFound if
        there is no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            conn.execute("UPDATE sessions SET closed = ? WHERE id = ?", (int(closed), session_id))

    def insert_session(
        self,
        title: str,
        persona: str,
        settings: dict[str, Any],
        messages: Sequence[NewMessage],
        created_at: str | None = None,
        updated_at: str | None = None,
        system_prompt: str | None = None,
    ) -> int:
        """Add a whole chat at once (all or nothing), timestamps as given (None = now), with
        its own system prompt (None: its persona's); returns its id. Each message names its
        `parent` by its index in `messages` (an earlier one) or None; siblings keep their
        order. ValueError names the first bad message."""
        stamp = now()
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at, "
                "system_prompt) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    title,
                    persona,
                    json.dumps(settings),
                    created_at or stamp,
                    updated_at or stamp,
                    system_prompt,
                ),
            )
            session_id = inserted_id(cur)
            ids: list[int] = []
            for n, msg in enumerate(messages, 1):
                where = f"message {n}: "
                check("role", msg.role, ROLES, where)
                check("status", msg.status, STATUSES, where)
                if msg.parent is not None and not 0 <= msg.parent < len(ids):
                    raise ValueError(
                        f"{where}parent must be an earlier message; got {msg.parent!r}"
                    )
                ids.append(
                    self._insert(
                        session_id,
                        None if msg.parent is None else ids[msg.parent],
                        msg.role,
                        msg.content,
                        msg.status,
                        msg.metadata or {},
                        msg.kept,
                        msg.created_at or stamp,
                    )
                )
        return session_id

    def delete_session(self, session_id: int) -> None:
        """Delete a chat and all its messages; NotFound if there is no such chat."""
        with transaction(self._conn) as conn:
            if conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise NotFound(f"no chat with id {session_id}")

    def delete_if_empty(self, session_id: int) -> bool:
        """Delete a chat only if it has no messages and no system prompt of its own, in one
        statement: a message another chatpage added to it meanwhile keeps it. True if it was
        deleted; False if it was kept or is gone already."""
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "DELETE FROM sessions WHERE id = ? AND system_prompt IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM messages WHERE session_id = ?)",
                (session_id, session_id),
            )
        return cur.rowcount > 0

    def set_draft(self, session_id: int, text: str) -> None:
        """Keep the text left unsent in a chat's prompt ("" for none); NotFound if there is no
        such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            if (
                conn.execute(
                    "UPDATE sessions SET draft = ? WHERE id = ?", (text, session_id)
                ).rowcount
                == 0
            ):
                raise NotFound(f"no chat with id {session_id}")

    def set_system_prompt(self, session_id: int, text: str | None) -> None:
        """Give a chat its own system prompt (None: back to its persona's); NotFound if there
        is no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            if (
                conn.execute(
                    "UPDATE sessions SET system_prompt = ? WHERE id = ?", (text, session_id)
                ).rowcount
                == 0
            ):
                raise NotFound(f"no chat with id {session_id}")

    def draft(self, session_id: int) -> str:
        """The text left unsent in a chat's prompt ("" for none); NotFound if there is no
        such chat."""
        row = self._conn.execute(
            "SELECT draft FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"no chat with id {session_id}")
        draft: str = row["draft"]
        return draft

    def search(self, term: str, limit: int = 50) -> list[SearchHit]:
        """Messages containing every word of `term` (the last word may be a prefix), best
        first. `term` is plain user text: FTS operators in it are taken literally."""
        query = _fts_query(term)
        if not query:
            return []
        start, end = SNIPPET_MARKS
        rows = self._conn.execute(
            "SELECT m.session_id, s.title, m.id, m.role, "
            "snippet(messages_fts, 0, ?, ?, '…', 12) AS snippet "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "JOIN sessions s ON s.id = m.session_id "
            "WHERE messages_fts MATCH ? ORDER BY rank, m.id LIMIT ?",
            (start, end, query, limit),
        )
        return [SearchHit.from_row(row) for row in rows]
