"""A chat's messages as a tree: every message has a parent (None for the first ones), and the
messages sharing a parent are siblings (the versions of one turn: an edited question, a
regenerated reply, alternatives). One sibling is ``kept``, the current one at that fork;
following the kept children from the top gives the chat's active path, the transcript on show.
Which one is current is the caller's to say (the app's `chatpage.chat.tree` decides it, on
adding and on removing a version); the store keeps what it is told, one kept per fork.

`MessageTree` holds these operations for `Store` (it needs only ``self._conn``).
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any, Literal

from chatpage.store.rows import MessageRow, NotFound
from chatpage.store.schema import inserted_id, transaction
from chatpage.vocab import MessageStatus, Role

ROLES = tuple(Role)
STATUSES = tuple(MessageStatus)
TIP: Literal["tip"] = "tip"
"""`add_message`'s default parent: the last message of the chat's active path."""

ACTIVE_PATH = """
    WITH RECURSIVE path(id) AS (
        SELECT id FROM messages WHERE session_id = {session} AND parent_id IS NULL AND kept
        UNION ALL
        SELECT m.id FROM messages m JOIN path ON m.parent_id = path.id WHERE m.kept)
"""
"""The ids on a chat's active path, as a CTE (format ``session`` with a parameter or column)."""


def now() -> str:
    """The current time as stored: ISO 8601 in UTC."""
    return datetime.now(UTC).isoformat(timespec="microseconds")


def check(field: str, value: str, allowed: tuple[str, ...], where: str = "") -> None:
    """ValueError naming `field` unless `value` is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{where}{field} must be one of {', '.join(allowed)}; got {value!r}")


class MessageTree:
    """The message operations of `Store`."""

    _conn: sqlite3.Connection

    def _require_session(self, session_id: int) -> None:
        if (
            self._conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone()
            is None
        ):
            raise NotFound(f"no chat with id {session_id}")

    def _touch(self, session_id: int, when: str) -> None:
        self._conn.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (when, session_id))

    def _row(self, message_id: int) -> sqlite3.Row:
        query = "SELECT * FROM messages WHERE id = ?"
        row: sqlite3.Row | None = self._conn.execute(query, (message_id,)).fetchone()
        if row is None:
            raise NotFound(f"no message with id {message_id}")
        return row

    def add_message(
        self,
        session_id: int,
        role: str,
        content: str,
        status: str = "done",
        metadata: dict[str, Any] | None = None,
        *,
        parent_id: int | None | Literal["tip"] = TIP,
        kept: bool = True,
    ) -> int:
        """Add a message under `parent_id` (None: at the top; the default: after the last
        message of the active path) and return its id. If `kept` it becomes the current one
        of its siblings, so its branch is the active path. NotFound/ValueError for a bad chat,
        parent, role or status."""
        check("role", role, ROLES)
        check("status", status, STATUSES)
        stamp = now()
        with transaction(self._conn):
            self._require_session(session_id)
            if parent_id == TIP:
                path = self.active_path(session_id)
                parent_id = path[-1].id if path else None
            message_id = self._insert(
                session_id, parent_id, role, content, status, metadata or {}, kept, stamp
            )
            self._touch(session_id, stamp)
        return message_id

    def _insert(
        self,
        session_id: int,
        parent_id: int | None,
        role: str,
        content: str,
        status: str,
        metadata: dict[str, Any],
        kept: bool,
        created_at: str,
    ) -> int:
        position = 0
        if parent_id is not None:
            parent = self._conn.execute(
                "SELECT session_id, position FROM messages WHERE id = ?", (parent_id,)
            ).fetchone()
            if parent is None or parent["session_id"] != session_id:
                raise NotFound(f"no message {parent_id} in chat {session_id}")
            position = parent["position"] + 1
        if kept:
            self._keep(session_id, parent_id, None)
        cur = self._conn.execute(
            "INSERT INTO messages (session_id, parent_id, position, role, content, status, "
            "metadata, kept, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session_id,
                parent_id,
                position,
                role,
                content,
                status,
                json.dumps(metadata),
                int(kept),
                created_at,
            ),
        )
        return inserted_id(cur)

    def update_message(
        self,
        message_id: int,
        content: str | None = None,
        status: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Replace a message's content, status and/or metadata (None = leave as is);
        NotFound if there is no such message."""
        if status is not None:
            check("status", status, STATUSES)
        with transaction(self._conn) as conn:
            row = self._row(message_id)
            for column, value in (
                ("content", content),
                ("status", status),
                ("metadata", None if metadata is None else json.dumps(metadata)),
            ):
                if value is not None:
                    conn.execute(
                        f"UPDATE messages SET {column} = ? WHERE id = ?", (value, message_id)
                    )
            self._touch(row["session_id"], now())

    def messages(self, session_id: int, active_only: bool = False) -> list[MessageRow]:
        """A chat's messages: every branch, parents before children (by depth, then age); or
        with `active_only` just the active path, the transcript on show."""
        if active_only:
            return self.active_path(session_id)
        rows = self._conn.execute(
            "SELECT * FROM messages WHERE session_id = ? ORDER BY position, id", (session_id,)
        )
        return [MessageRow.from_row(row) for row in rows]

    def active_path(self, session_id: int) -> list[MessageRow]:
        """The current message at every fork, from the first message down."""
        rows = self._conn.execute(
            ACTIVE_PATH.format(session="?") + "SELECT m.* FROM messages m JOIN path USING (id) "
            "ORDER BY m.position",
            (session_id,),
        )
        return [MessageRow.from_row(row) for row in rows]

    def siblings(self, message_id: int) -> list[MessageRow]:
        """The versions of this message's turn (it included), oldest first; NotFound if there
        is no such message."""
        row = self._row(message_id)
        rows = self._conn.execute(
            "SELECT * FROM messages WHERE session_id = ? AND parent_id IS ? ORDER BY id",
            (row["session_id"], row["parent_id"]),
        )
        return [MessageRow.from_row(r) for r in rows]

    def _keep(self, session_id: int, parent_id: int | None, message_id: int | None) -> None:
        """Make `message_id` the one kept child of `parent_id` (None: none is, yet)."""
        self._conn.execute(
            "UPDATE messages SET kept = (id IS ?) WHERE session_id = ? AND parent_id IS ?",
            (message_id, session_id, parent_id),
        )

    def select(self, message_id: int) -> None:
        """Make this message the current one of its siblings (its branch becomes the active
        path down to there); NotFound if there is no such message."""
        with transaction(self._conn):
            row = self._row(message_id)
            self._keep(row["session_id"], row["parent_id"], message_id)

    def delete_message(self, message_id: int, *, shown: int | None) -> int:
        """Delete a message and everything that follows it on every branch, and keep `shown`
        as the current one of the siblings left (the version its turn shows now, as the
        caller's tree says; None: none is left). Returns how many were deleted; NotFound if
        there is no such message, ValueError if `shown` is not one of its siblings."""
        with transaction(self._conn) as conn:
            row = self._row(message_id)
            if shown is not None:
                other = self._row(shown)
                if shown == message_id or (other["session_id"], other["parent_id"]) != (
                    row["session_id"],
                    row["parent_id"],
                ):
                    raise ValueError(
                        f"message {shown} is not another version of message {message_id}'s turn"
                    )
            doomed = [
                r[0]
                for r in conn.execute(
                    "WITH RECURSIVE below(id) AS (SELECT ? UNION ALL "
                    "SELECT m.id FROM messages m JOIN below ON m.parent_id = below.id) "
                    "SELECT id FROM below",
                    (message_id,),
                )
            ]
            conn.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in doomed])
            if shown is not None:
                self._keep(row["session_id"], row["parent_id"], shown)
            self._touch(row["session_id"], now())
        return len(doomed)

    def clear_messages(self, session_id: int) -> int:
        """Delete every message of a chat (the chat itself stays); returns how many."""
        with transaction(self._conn) as conn:
            self._require_session(session_id)
            count: int = conn.execute(
                "SELECT COUNT(*) FROM messages WHERE session_id = ?", (session_id,)
            ).fetchone()[0]
            conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            if count:
                self._touch(session_id, now())
        return count

    def mark_streaming_interrupted(self) -> int:
        """At start-up: every message still 'streaming' (the app died mid-reply) becomes
        'interrupted'. Returns how many were changed."""
        with transaction(self._conn) as conn:
            cur = conn.execute(
                "UPDATE messages SET status = 'interrupted' WHERE status = 'streaming'"
            )
        return cur.rowcount
