"""The chat database file: its schema (versioned migrations) and how it is opened.

`open_database` never raises for a bad file: a corrupt or unreadable database is moved aside
(``chatpage.db.corrupt-YYYYmmdd-HHMMSS``, with its WAL) and a new one started; one that cannot
be used now (read-only, a full disk, a newer schema, busy past the timeout, any other error, a
data dir that cannot be created) is left alone and replaced by an in-memory database. `Opened.notice` says what happened, in one line.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

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


def _migrate_to_2(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE sessions ADD COLUMN closed INTEGER NOT NULL DEFAULT 0")


def _migrate_to_3(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE sessions ADD COLUMN draft TEXT NOT NULL DEFAULT ''")


def _migrate_to_4(conn: sqlite3.Connection) -> None:
    """Messages form a tree: each names its parent. A linear chat becomes a chain through its
    kept messages; the alternatives of a reply become siblings under the same parent."""
    conn.execute(
        "ALTER TABLE messages ADD COLUMN parent_id INTEGER "
        "REFERENCES messages(id) ON DELETE CASCADE"
    )
    conn.execute("""UPDATE messages SET parent_id = (
        SELECT k.id FROM messages k WHERE k.session_id = messages.session_id
        AND k.position < messages.position
        ORDER BY k.position DESC, k.kept DESC, k.id DESC LIMIT 1)""")
    conn.execute("DROP INDEX messages_by_group")
    conn.execute("ALTER TABLE messages DROP COLUMN group_id")
    conn.execute("CREATE INDEX messages_by_parent ON messages(session_id, parent_id, id)")
    conn.execute("CREATE INDEX messages_children ON messages(parent_id)")


def _migrate_to_5(conn: sqlite3.Connection) -> None:
    """A chat's own system prompt (set with /system); NULL: its persona's."""
    conn.execute("ALTER TABLE sessions ADD COLUMN system_prompt TEXT")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _migrate_to_1,
    _migrate_to_2,
    _migrate_to_3,
    _migrate_to_4,
    _migrate_to_5,
]
"""MIGRATIONS[v] takes a database from schema version v to v + 1; append, never edit."""
SCHEMA_VERSION = len(MIGRATIONS)


class NewerSchemaError(sqlite3.DatabaseError):
    """The database was written by a newer chatpage."""


class CorruptDatabase(sqlite3.DatabaseError):
    """The database failed its integrity check."""


def inserted_id(cur: sqlite3.Cursor) -> int:
    """The id of the row the INSERT just run on ``cur`` made."""
    if cur.lastrowid is None:
        raise sqlite3.InterfaceError("the statement inserted no row")
    return cur.lastrowid


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def migrate(conn: sqlite3.Connection) -> int:
    """Bring `conn` up to SCHEMA_VERSION, one transaction per step; returns the old version.

    Each step reads the version inside its own write transaction: another chatpage starting at
    the same moment may have taken the database up already, and a step must never run twice."""
    old = None
    while True:
        with transaction(conn):
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            old = version if old is None else old
            if version > SCHEMA_VERSION:
                raise NewerSchemaError(
                    f"it has schema version {version}, this chatpage knows "
                    f"{SCHEMA_VERSION}; upgrade chatpage"
                )
            if version == SCHEMA_VERSION:
                return old
            MIGRATIONS[version](conn)
            conn.execute(f"PRAGMA user_version = {version + 1:d}")


# -- opening -----------------------------------------------------------------------------------


def connect(target: str | Path) -> sqlite3.Connection:
    """The one place a connection is made (tests replace it to simulate a read-only file)."""
    return sqlite3.connect(target, isolation_level=None, timeout=5.0)


def prepare(conn: sqlite3.Connection, *, check: bool) -> sqlite3.Connection:
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        if check:
            result = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
            if result != "ok":
                raise CorruptDatabase(f"integrity check failed: {result}")
        migrate(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")  # proves we can write
    except BaseException:
        conn.close()
        raise
    return conn


_CORRUPT = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}


def _corrupt(err: sqlite3.Error, path: Path) -> bool:
    """True only for a file that cannot be used at all: corrupt, not a database, failing its
    integrity check, or unreadable. Anything else (busy, locked, read-only, full, a schema
    error) leaves the file where it is: it may be a good database that another chatpage is
    using or upgrading right now."""
    code = getattr(err, "sqlite_errorcode", None)
    return (
        isinstance(err, CorruptDatabase)
        or _unreadable(path)
        or (code is not None and code & 0xFF in _CORRUPT)
    )


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


@dataclass
class Opened:
    """A ready connection; `persistent` False: in memory, `fault` says why."""

    conn: sqlite3.Connection
    persistent: bool
    notice: str | None = None
    fault: str | None = None


_BUSY = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
BUSY_RETRIES = 4


def _prepare_when_free(path: Path) -> sqlite3.Connection:
    """Connect to and prepare `path`, trying again a few times while it is busy: another
    chatpage starting at the same moment holds it for a moment, and some of SQLite's locks at
    start-up (WAL set-up, recovery) answer busy at once instead of waiting."""
    attempt = 0
    while True:
        try:
            return prepare(connect(path), check=True)
        except sqlite3.Error as err:
            code = getattr(err, "sqlite_errorcode", None)
            if attempt == BUSY_RETRIES or code is None or code & 0xFF not in _BUSY:
                raise
        attempt += 1
        time.sleep(0.1 * attempt)


def open_database(path: Path) -> Opened:
    """Open (creating its folder 0700, migrating) the database at `path`; see the module doc."""
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, mode=0o700)
            path.parent.chmod(0o700)
        return Opened(_prepare_when_free(path), persistent=True)
    except OSError as err:
        return _in_memory(path, _reason(err))
    except sqlite3.Error as err:
        if not _corrupt(err, path):
            return _in_memory(path, _reason(err))
        first_error = err
    try:
        moved = _move_aside(path)
        opened = Opened(prepare(connect(path), check=False), persistent=True)
    except (OSError, sqlite3.Error) as err:
        return _in_memory(path, f"{_reason(first_error)}; then {_reason(err)}")
    opened.notice = (
        f"The chat database {path} could not be read ({_reason(first_error)}); "
        f"it was moved to {moved} and a new one was started."
    )
    return opened


def _in_memory(path: Path, reason: str) -> Opened:
    fault = f"cannot use {path} ({reason})"
    return Opened(
        prepare(connect(":memory:"), check=False),
        persistent=False,
        notice=f"chatpage is running without saving chats: {fault}.",
        fault=fault,
    )
