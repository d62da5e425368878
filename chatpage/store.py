"""SQLite persistence for chats: sessions, messages (with alternatives), full-text search.

The database is ``data_dir()/chatpage.db`` (WAL mode, schema versioned by ``PRAGMA user_version``).
Alternatives are sibling assistant messages of one reply: they share a ``group_id`` (the id of the
group's first message) and a position, and exactly the one the user keeps has ``kept = 1``.

Faults never stop the app: a corrupt database is moved aside and a new one started; a database
that cannot be written is replaced by an in-memory one. Either way `Store.notice` says so.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from chatpage.paths import data_dir

DB_NAME = "chatpage.db"
ROLES = ("user", "assistant", "system")
STATUSES = ("done", "streaming", "stopped", "interrupted", "error")
EXPORT_FORMAT = "chatpage-session"
EXPORT_VERSION = 1
SNIPPET_MARKS = ("«", "»")
"""Put around the matched words in `SearchHit.snippet`."""


@dataclass(frozen=True)
class SessionRow:
    """One chat. Timestamps are ISO 8601 in UTC; message_count counts the kept messages."""

    id: int
    title: str
    persona: str
    settings: dict[str, Any]
    created_at: str
    updated_at: str
    message_count: int


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
class SearchHit:
    """A message matching a search; snippet marks the matches with SNIPPET_MARKS."""

    session_id: int
    session_title: str
    message_id: int
    role: str
    snippet: str


# -- schema ------------------------------------------------------------------------------------

def _migrate_to_1(conn: sqlite3.Connection) -> None:
    for statement in (
        """CREATE TABLE sessions (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            persona TEXT NOT NULL,
            settings TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL)""",
        """CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'done',
            metadata TEXT NOT NULL DEFAULT '{}',
            group_id INTEGER,
            kept INTEGER NOT NULL DEFAULT 1,
            created_at TEXT NOT NULL)""",
        "CREATE INDEX messages_by_session ON messages(session_id, position, id)",
        "CREATE INDEX messages_by_group ON messages(group_id) WHERE group_id IS NOT NULL",
        "CREATE INDEX messages_streaming ON messages(status) WHERE status = 'streaming'",
        """CREATE VIRTUAL TABLE messages_fts USING fts5(
            content, content='messages', content_rowid='id',
            tokenize='unicode61 remove_diacritics 2')""",
        """CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
        """CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
        END""",
        """CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content)
            VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
    ):
        conn.execute(statement)


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_to_1]
"""MIGRATIONS[v] takes a database from schema version v to v + 1; append, never edit."""
SCHEMA_VERSION = len(MIGRATIONS)


class NewerSchemaError(sqlite3.DatabaseError):
    """The database was written by a newer chatpage."""


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def migrate(conn: sqlite3.Connection) -> int:
    """Bring `conn` up to SCHEMA_VERSION, one transaction per step; returns the old version."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise NewerSchemaError(f"it has schema version {version}, this chatpage knows "
                               f"{SCHEMA_VERSION}; upgrade chatpage")
    for step in range(version, SCHEMA_VERSION):
        with _transaction(conn):
            MIGRATIONS[step](conn)
            conn.execute(f"PRAGMA user_version = {step + 1:d}")
    return version


# -- opening -----------------------------------------------------------------------------------

def _connect(target: str | Path) -> sqlite3.Connection:
    """The one place a connection is made (tests replace it to simulate a read-only file)."""
    return sqlite3.connect(target, isolation_level=None, timeout=5.0)


def _prepare(conn: sqlite3.Connection, *, check: bool) -> sqlite3.Connection:
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        if check:
            result = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if result != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {result}")
        migrate(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")  # proves we can write
    except BaseException:
        conn.close()
        raise
    return conn


_UNWRITABLE = {sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM,
               sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_BUSY,
               sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_AUTH}


def _cannot_write(err: sqlite3.Error, path: Path) -> bool:
    """True when the file is fine but we may not write it (vs. a file we cannot use at all)."""
    code = getattr(err, "sqlite_errorcode", None)
    return isinstance(err, NewerSchemaError) or (
        code is not None and code & 0xFF in _UNWRITABLE and not _unreadable(path))


def _unreadable(path: Path) -> bool:
    """A database file that exists but that we may not read (moved aside like a corrupt one)."""
    return path.is_file() and not os.access(path, os.R_OK)


def _move_aside(path: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    path.rename(target)
    for suffix in ("-wal", "-shm"):  # a stale WAL would be replayed into the new database
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err) or type(err).__name__


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
                 notice: str | None = None) -> None:
        self._conn = conn
        self.path = path
        self._persistent = persistent
        self.notice = notice
        """One line for the user when something went wrong opening the database, else None."""

    @classmethod
    def open(cls, path: Path | None = None) -> Store:
        """Open (creating, migrating) the database at `path` (default data_dir()/chatpage.db).

        Never raises for a bad file: a corrupt or unreadable one is moved aside and a fresh one
        started; an unwritable location gives an in-memory store. `notice` then says what happened.
        """
        path = Path(path) if path is not None else data_dir() / DB_NAME
        try:
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True, mode=0o700)
                path.parent.chmod(0o700)
            return cls(_prepare(_connect(path), check=True), path, persistent=True)
        except OSError as err:
            return cls._in_memory(path, _reason(err))
        except sqlite3.Error as err:
            if _cannot_write(err, path):
                return cls._in_memory(path, _reason(err))
            first_error = err
        try:
            moved = _move_aside(path)
            store = cls(_prepare(_connect(path), check=False), path, persistent=True)
        except (OSError, sqlite3.Error) as err:
            return cls._in_memory(path, f"{_reason(first_error)}; then {_reason(err)}")
        store.notice = (f"The chat database {path} could not be read ({_reason(first_error)}); "
                        f"it was moved to {moved} and a new one was started.")
        return store

    @classmethod
    def _in_memory(cls, path: Path, reason: str) -> Store:
        conn = _prepare(_connect(":memory:"), check=False)
        notice = f"chatpage is running without saving chats: cannot use {path} ({reason})."
        return cls(conn, path, persistent=False, notice=notice)

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
        with _transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)", (title, persona, json.dumps(settings or {}), now, now))
        return int(cur.lastrowid)

    _SESSION_SELECT = (
        "SELECT s.id, s.title, s.persona, s.settings, s.created_at, s.updated_at, "
        "(SELECT COUNT(*) FROM messages m WHERE m.session_id = s.id AND m.kept) FROM sessions s ")

    @staticmethod
    def _session(row: tuple[Any, ...]) -> SessionRow:
        return SessionRow(row[0], row[1], row[2], json.loads(row[3]), row[4], row[5], row[6])

    def list_sessions(self) -> list[SessionRow]:
        """All chats, most recently updated first."""
        rows = self._conn.execute(self._SESSION_SELECT + "ORDER BY s.updated_at DESC, s.id DESC")
        return [self._session(row) for row in rows]

    def get_session(self, session_id: int) -> SessionRow | None:
        """The chat with this id, or None."""
        row = self._conn.execute(self._SESSION_SELECT + "WHERE s.id = ?", (session_id,)).fetchone()
        return None if row is None else self._session(row)

    def update_session(self, session_id: int, *, title: str | None = None,
                       persona: str | None = None, settings: dict[str, Any] | None = None) -> None:
        """Change a chat's title, persona and/or settings (None = leave as is); KeyError if
        there is no such chat. Does not move the chat in the recency order."""
        with _transaction(self._conn) as conn:
            self._require_session(session_id)
            for column, value in (("title", title), ("persona", persona),
                                  ("settings", None if settings is None else json.dumps(settings))):
                if value is not None:
                    conn.execute(f"UPDATE sessions SET {column} = ? WHERE id = ?",
                                 (value, session_id))

    def rename_session(self, session_id: int, title: str) -> None:
        """Set a chat's title; KeyError if there is no such chat."""
        self.update_session(session_id, title=title)

    def delete_session(self, session_id: int) -> None:
        """Delete a chat and all its messages; KeyError if there is no such chat."""
        with _transaction(self._conn) as conn:
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
        with _transaction(self._conn) as conn:
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
        with _transaction(self._conn) as conn:
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
        with _transaction(self._conn) as conn:
            row = conn.execute("SELECT group_id FROM messages WHERE id = ?",
                               (message_id,)).fetchone()
            if row is None or row[0] != group_id:
                raise ValueError(f"message {message_id} is not an alternative in group {group_id}")
            conn.execute("UPDATE messages SET kept = (id = ?) WHERE group_id = ?",
                         (message_id, group_id))

    def mark_streaming_interrupted(self) -> int:
        """At start-up: every message still 'streaming' (the app died mid-reply) becomes
        'interrupted'. Returns how many were changed."""
        with _transaction(self._conn) as conn:
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

    # -- export / import -------------------------------------------------------------------

    def export_session(self, session_id: int, fmt: Literal["md", "json"]) -> str:
        """The chat as Markdown (the kept transcript, for reading) or JSON (everything, for
        `import_json`). KeyError for an unknown chat, ValueError for an unknown format."""
        session = self.get_session(session_id)
        if session is None:
            raise KeyError(f"no chat with id {session_id}")
        if fmt == "json":
            return _to_json(session, self.messages(session_id))
        if fmt == "md":
            return _to_markdown(session, self.messages(session_id))
        raise ValueError(f"unknown export format {fmt!r}; use 'md' or 'json'")

    def import_json(self, text: str) -> int:
        """Add a chat from `export_session(..., "json")` output; returns the new chat's id.
        Raises ValueError with a one-line reason if the text is not such an export."""
        data = _parse_export(text)
        with _transaction(self._conn) as conn:
            cur = conn.execute(
                "INSERT INTO sessions (title, persona, settings, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (data["title"], data["persona"], json.dumps(data["settings"]),
                 data["created_at"], data["updated_at"]))
            session_id = int(cur.lastrowid)
            groups: dict[int, tuple[int, int]] = {}  # exported group -> (group_id, position)
            position = -1
            for msg in data["messages"]:
                group = msg["group"]
                if group in groups:
                    group_id, at = groups[group]
                else:
                    position += 1
                    group_id, at = None, position
                new_id = self._insert(session_id, at, msg["role"], msg["content"], msg["status"],
                                      msg["metadata"], group_id, msg["kept"], msg["created_at"])
                if group is not None and group not in groups:
                    groups[group] = (new_id, at)
                    conn.execute("UPDATE messages SET group_id = id WHERE id = ?", (new_id,))
        return session_id


def _check(field: str, value: str, allowed: tuple[str, ...], where: str = "") -> None:
    if value not in allowed:
        raise ValueError(f"{where}{field} must be one of {', '.join(allowed)}; got {value!r}")


def _to_json(session: SessionRow, messages: list[MessageRow]) -> str:
    group_numbers: dict[int, int] = {}
    for msg in messages:
        if msg.group_id is not None:
            group_numbers.setdefault(msg.group_id, len(group_numbers) + 1)
    doc = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "title": session.title, "persona": session.persona, "settings": session.settings,
        "created_at": session.created_at, "updated_at": session.updated_at,
        "messages": [
            {"role": m.role, "content": m.content, "status": m.status, "metadata": m.metadata,
             "created_at": m.created_at,
             "group": None if m.group_id is None else group_numbers[m.group_id],
             "kept": m.kept}
            for m in messages
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def local_time(stamp: str) -> str:
    """A stored UTC timestamp as local "YYYY-MM-DD HH:MM" (unchanged if it is not ISO 8601)."""
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def _to_markdown(session: SessionRow, messages: list[MessageRow]) -> str:
    lines = [f"# {session.title}", "",
             f"- Persona: {session.persona}",
             f"- Started: {local_time(session.created_at)}",
             f"- Updated: {local_time(session.updated_at)}"]
    if session.settings:
        listed = ", ".join(f"{k}={v}" for k, v in session.settings.items())
        lines.append(f"- Settings: {listed}")
    siblings: dict[int, int] = {}
    for msg in messages:
        if msg.group_id is not None:
            siblings[msg.group_id] = siblings.get(msg.group_id, 0) + 1
    for msg in messages:
        if not msg.kept:
            continue
        lines += ["", f"## {msg.role.capitalize()}", "", msg.content.rstrip("\n")]
        if msg.status != "done":
            lines += ["", f"*({msg.status})*"]
        if msg.group_id is not None and siblings[msg.group_id] > 1:
            lines += ["", f"*(1 of {siblings[msg.group_id]} alternatives; the JSON export has "
                          "all of them)*"]
    return "\n".join(lines) + "\n"


def _parse_export(text: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON (line {err.lineno}, column {err.colno}): "
                         f"{err.msg}") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ValueError("not a chatpage export: expected a JSON object with "
                         f'"format": "{EXPORT_FORMAT}"')
    if not isinstance(data.get("version"), int) or data["version"] > EXPORT_VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r}; this chatpage "
                         f"reads version {EXPORT_VERSION}")
    now = _now()
    out = {
        "title": _field(data, "title", str, "the chat"),
        "persona": _field(data, "persona", str, "the chat"),
        "settings": _field(data, "settings", dict, "the chat", {}),
        "created_at": _field(data, "created_at", str, "the chat", now),
        "updated_at": _field(data, "updated_at", str, "the chat", now),
        "messages": [],
    }
    messages = _field(data, "messages", list, "the chat")
    for n, msg in enumerate(messages, 1):
        where = f"message {n}"
        if not isinstance(msg, dict):
            raise ValueError(f"{where} is not a JSON object")
        role = _field(msg, "role", str, where)
        status = _field(msg, "status", str, where, "done")
        _check("role", role, ROLES, f"{where}: ")
        _check("status", status, STATUSES, f"{where}: ")
        group = msg.get("group")
        if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
            raise ValueError(f"{where}: 'group' must be a whole number or null")
        out["messages"].append({
            "role": role, "status": status, "group": group,
            "content": _field(msg, "content", str, where),
            "metadata": _field(msg, "metadata", dict, where, {}),
            "created_at": _field(msg, "created_at", str, where, now),
            "kept": _field(msg, "kept", bool, where, True),
        })
    return out


_MISSING = object()


def _field(data: dict[str, Any], key: str, kind: type, where: str,
           default: Any = _MISSING) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING and default is not _MISSING:
        return default
    if not isinstance(value, kind):
        names = {str: "text", dict: "an object", list: "a list", bool: "true or false"}
        raise ValueError(f"{where}: {key!r} must be {names[kind]}")
    return value
