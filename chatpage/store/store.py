"""SQLite persistence for chats: sessions, messages (with alternatives), full-text search.

The database is ``data_dir()/chatpage.db`` (WAL mode, schema versioned by ``PRAGMA user_version``).
Alternatives are sibling assistant messages of one reply: they share a ``group_id`` (the id of the
group's first message) and a position, and exactly the one the user keeps has ``kept = 1``.

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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from chatpage.config.paths import data_dir
from chatpage.store.schema import open_database, transaction

DB_NAME = "chatpage.db"
ROLES = ("user", "assistant", "system")
STATUSES = ("done", "streaming", "stopped", "interrupted", "error")
SNIPPET_MARKS = ("«", "»")
"""Put around the matched words in `SearchHit.snippet`."""


@dataclass(frozen=True)
class SessionRow:
    """One chat. Timestamps are ISO 8601 in UTC; message_count counts the kept messages;
    closed: the user closed it in the app (it is still saved)."""

    id: int
    title: str
    persona: str
    settings: dict[str, Any]
    created_at: str
    updated_at: str
    message_count: int
    closed: bool = False


@dataclass(frozen=True)
class MessageRow:
    """One message. group_id is None for an ordinary message; alternatives share it."""

    id: int
    session_id: int
    position: int
    role: str
    content: str
    status: str
    metadata: dict[str, Any]
    group_id: int | None
    kept: bool
    created_at: str


@dataclass(frozen=True)
class NewMessage:
    """A message for `Store.insert_session`: alternatives of one reply share a `group` key
    (any number, local to the call), and one of them is `kept`."""

    role: str
    content: str
    status: str = "done"
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    group: int | None = None
    kept: bool = True


@dataclass(frozen=True)
class SearchHit:
    """A message matching a search; snippet marks the matches with SNIPPET_MARKS."""

    session_id: int
    session_title: str
    message_id: int
    role: str
    snippet: str


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


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
    if " " in cut[limit // 2:]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" .,;:-") + "…"


def _fts_query(term: str) -> str:
    """User text -> an FTS5 query that cannot be a syntax error: every word a quoted phrase
    (all must match), the last one also as a prefix so search works while typing."""
    words = [w for w in term.replace("\x00", "").split() if any(c.isalnum() for c in w)]
    quoted = ['"' + word.replace('"', '""') + '"' for word in words]
    return " ".join(quoted) + " *" if quoted else ""


class Store:
    """The chat database. Use `Store.open()`; call it from one thread (the UI's)."""

    def __init__(self, conn: sqlite3.Connection, path: Path, *, persistent: bool,
                 notice: str | None = None, fault: str | None = None) -> None:
        self._conn = conn
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
        return cls(opened.conn, path, persistent=opened.persistent, notice=opened.notice,
                   fault=opened.fault)

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

    def create_session(self, title: str, persona: str,
                       settings: dict[str, Any] | None = None) -> int:
        """Add an empty chat and return its id."""
        now = _now()
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)", (title, persona, json.dumps(settings or {}), now, now))
        return int(cur.lastrowid)

    _SESSION_SELECT = (
        "SELECT s.id, s.title, s.persona, s.settings, s.created_at, s.updated_at, "
        "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.kept), s.closed "
        "FROM sessions s ")

    @staticmethod
    def _session(row: tuple[Any, ...]) -> SessionRow:
        return SessionRow(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6],
                          bool(row[7]))

    def list_sessions(self, closed: bool | None = None) -> list[SessionRow]:
        """Chats, most recently updated first: all of them, or only the closed (True) or the
        open (False) ones."""
        where = "" if closed is None else f"WHERE s.closed = {int(closed):d} "
        rows = self._conn.execute(
            self._SESSION_SELECT + where + "ORDER BY s.updated_at DESC, s.id DESC")
        return [self._session(row) for row in rows]

    def get_session(self, session_id: int) -> SessionRow | None:
        """The chat with this id, or None."""
        row = self._conn.execute(self._SESSION_SELECT + "WHERE s.id = ?", (session_id,)).fetchone()
        return None if row is None else self._session(row)

    def update_session(self, session_id: int, *, title: str | None = None,
                       persona: str | None = None, settings: dict[str, Any] | None = None) -> None:
        """Change a chat's title, persona and/or settings (None = leave as is); KeyError if
        there is no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            for column, value in (("title", title), ("persona", persona),
                                  ("settings", None if settings is None else json.dumps(settings))):
                if value is not None:
                    conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?",
                                 (value, session_id))

    def rename_session(self, session_id: int, title: str) -> None:
        """Set a chat's title; KeyError if there is no such chat."""
        self.update_session(session_id, title=title)

    def set_closed(self, session_id: int, closed: bool) -> None:
        """Mark a chat closed (kept, but not reopened at start) or open again; KeyError if
        there is no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            conn.execute("UPDATE sessions SET closed = ? WHERE id = ?", (int(closed), session_id))

    def insert_session(self, title: str, persona: str, settings: dict[str, Any],
                       messages: Sequence[NewMessage], created_at: str | None = None,
                       updated_at: str | None = None) -> int:
        """Add a whole chat at once (all or nothing), timestamps as given (None = now);
        returns its id. Messages keep their order; those sharing a `group` become alternatives
        of one reply. ValueError names the first bad message."""
        now = _now()
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (title, persona, json.dumps(settings), created_at or now, updated_at or now))
            session_id = int(cur.lastrowid)
            groups: dict[int, tuple[int, int]] = {}  # group key -> (group_id, position)
            position = -1
            for n, msg in enumerate(messages, 1):
                _check("role", msg.role, ROLES, f"message {n}: ")
                _check("status", msg.status, STATUSES, f"message {n}: ")
                if msg.group in groups:
                    group_id, at = groups[msg.group]
                else:
                    position += 1
                    group_id, at = None, position
                new_id = self._insert(session_id, at, msg.role, msg.content, msg.status,
                                      msg.metadata or {}, group_id, msg.kept,
                                      msg.created_at or now)
                if msg.group is not None and msg.group not in groups:
                    groups[msg.group] = (new_id, at)
                    conn.execute("UPDATE messages SET group_id = id WHERE id = ?", (new_id,))
        return session_id

    def delete_session(self, session_id: int) -> None:
        """Delete a chat and all its messages; KeyError if there is no such chat."""
        with transaction(self._conn) as conn:
            if conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 0:
                raise KeyError(f"no chat with id {session_id}")

    def _require_session(self, session_id: int) -> None:
        if self._conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() \
                is None:
            raise KeyError(f"no chat with id {session_id}")

    def _touch(self, session_id: int, when: str) -> None:
        self._conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (when, session_id))

    # -- messages --------------------------------------------------------------------------

    def add_message(self, session_id: int, role: str, content: str, status: str = "done",
                    metadata: dict[str, Any] | None = None, group_id: int | None = None,
                    kept: bool = True) -> int:
        """Append a message and return its id.

        With `group_id` (the id of any message of an existing reply) the new message is an
        alternative of that reply: same position, same group. If `kept`, it becomes the kept
        one and its siblings are un-kept. Raises KeyError/ValueError for a bad session, role,
        status or group.
        """
        _check("role", role, ROLES)
        _check("status", status, STATUSES)
        now = _now()
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            if group_id is None:
                position = conn.execute(
                    "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE session_id = ?",
                    (session_id,)).fetchone()[0]
            else:
                group_id, position = self._join_group(session_id, role, group_id, kept)
            message_id = self._insert(session_id, position, role, content, status,
                                      metadata or {}, group_id, kept, now)
            self._touch(session_id, now)
        return message_id

    def _join_group(self, session_id: int, role: str, member_id: int,
                    kept: bool) -> tuple[int, int]:
        row = self._conn.execute(
            "SELECT session_id, role, position, COALESCE(group_id, id) FROM messages WHERE id = ?",
            (member_id,)).fetchone()
        if row is None or row[0] != session_id or row[1] != role:
            raise ValueError(f"message {member_id} is not a {role} message of chat {session_id}")
        _, _, position, group_id = row
        self._conn.execute("UPDATE messages SET group_id = ? WHERE id = ?", (group_id, group_id))
        if kept:
            self._conn.execute("UPDATE messages SET kept = 0 WHERE group_id = ?", (group_id,))
        return group_id, position

    def _insert(self, session_id: int, position: int, role: str, content: str, status: str,
                metadata: dict[str, Any], group_id: int | None, kept: bool, created_at: str) -> int:
        cur = self._conn.execute(
            "INSERT INTO messages (session_id, position, role, content, status, metadata, "
            "group_id, kept, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (session_id, position, role, content, status, json.dumps(metadata), group_id,
             int(kept), created_at))
        return int(cur.lastrowid)

    def update_message(self, message_id: int, content: str | None = None,
                       status: str | None = None, metadata: dict[str, Any] | None = None) -> None:
        """Replace a message's content, status and/or metadata (None = leave as is);
        KeyError if there is no such message."""
        if status is not None:
            _check("status", status, STATUSES)
        with transaction(self._conn) as conn:
            row = conn.execute("SELECT session_id FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
            if row is None:
                raise KeyError(f"no message with id {message_id}")
            for column, value in (("content", content), ("status", status),
                                  ("metadata", None if metadata is None else json.dumps(metadata))):
                if value is not None:
                    conn.execute(f"UPDATE messages SET {column} = ? WHERE id = ?",
                                 (value, message_id))
            self._touch(row[0], _now())

    def messages(self, session_id: int, kept_only: bool = False) -> list[MessageRow]:
        """A chat's messages in order (alternatives next to each other, oldest first).
        With `kept_only`, just the transcript: one message per position."""
        rows = self._conn.execute(
            "SELECT id, session_id, position, role, content, status, metadata, group_id, kept, "
            "created_at FROM messages WHERE session_id = ? AND (kept OR NOT ?) "
            "ORDER BY position, id", (session_id, kept_only))
        return [MessageRow(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7],
                           bool(r[8]), r[9]) for r in rows]

    def keep_alternative(self, group_id: int, message_id: int) -> None:
        """Make `message_id` the kept reply of its group; ValueError if it is not in the group."""
        with transaction(self._conn) as conn:
            row = conn.execute("SELECT group_id FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
            if row is None or row[0] != group_id:
                raise ValueError(f"message {message_id} is not an alternative in group {group_id}")
            conn.execute("UPDATE messages SET kept = (id = ?) WHERE group_id = ?",
                         (message_id, group_id))

    def truncate_after(self, session_id: int, message_id: int | None) -> int:
        """Delete the chat's messages placed after `message_id` (its alternatives stay);
        None deletes them all. Returns how many were deleted. For a transcript whose end
        was dropped (an edited or regenerated turn, a cleared chat)."""
        with transaction(self._conn) as conn:
            if message_id is None:
                position = -1
            else:
                row = conn.execute("SELECT position FROM messages WHERE id = ? AND "
                                   "session_id = ?", (message_id, session_id)).fetchone()
                if row is None:
                    raise KeyError(f"no message {message_id} in chat {session_id}")
                position = row[0]
            cur = conn.execute("DELETE FROM messages WHERE session_id = ? AND position > ?",
                               (session_id, position))
            if cur.rowcount:
                self._touch(session_id, _now())
        return cur.rowcount

    # -- drafts ----------------------------------------------------------------------------

    def set_draft(self, session_id: int, text: str) -> None:
        """Keep the unsent text of a chat's message box ("" forgets it); KeyError if there is
        no such chat. Does not move the chat in the recency order."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            if text:
                conn.execute("INSERT INTO drafts (session_id, text) VALUES (?, ?) ON CONFLICT"
                             "(session_id) DO UPDATE SET text = excluded.text", (session_id, text))
            else:
                conn.execute("DELETE FROM drafts WHERE session_id = ?", (session_id,))

    def draft(self, session_id: int) -> str:
        """The chat's unsent text ("" when there is none)."""
        row = self._conn.execute("SELECT text FROM drafts WHERE session_id = ?",
                                 (session_id,)).fetchone()
        return row[0] if row else ""

    def mark_streaming_interrupted(self) -> int:
        """At start-up: every message still 'streaming' (the app died mid-reply) becomes
        'interrupted'. Returns how many were changed."""
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'")
        return cur.rowcount

    def search(self, term: str, limit: int = 50) -> list[SearchHit]:
        """Messages containing every word of `term` (the last word may be a prefix), best
        first. `term` is plain user text: FTS operators in it are taken literally."""
        query = _fts_query(term)
        if not query:
            return []
        start, end = SNIPPET_MARKS
        rows = self._conn.execute(
            "SELECT m.session_id, s.title, m.id, m.role, "
            "snippet(messages_fts, 0, ?, ?, '…', 12) "
            "FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid "
            "JOIN sessions s ON s.id = m.session_id "
            "WHERE messages_fts MATCH ? ORDER BY rank, m.id LIMIT ?",
            (start, end, query, limit))
        return [SearchHit(*row) for row in rows]


def _check(field: str, value: str, allowed: tuple[str, ...], where: str = "") -> None:
    if value not in allowed:
        raise ValueError(f"{where}{field} must be one of {', '.join(allowed)}; got {value!r}")
