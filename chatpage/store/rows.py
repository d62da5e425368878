"""What the store hands out and takes in: rows and the `NotFound` error."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any


class NotFound(KeyError):
    """No chat or message with the id asked for (a KeyError whose text reads as one line)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "not found"


@dataclass(frozen=True)
class SessionRow:
    """One chat. Timestamps are ISO 8601 in UTC; message_count counts the messages on the
    active path; closed: the user closed it in the app (it is still saved); draft: the text
    left unsent in its prompt; system_prompt: the chat's own (None: its persona's)."""

    id: int
    title: str
    persona: str
    settings: dict[str, Any]
    created_at: str
    updated_at: str
    message_count: int
    closed: bool = False
    draft: str = ""
    system_prompt: str | None = None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> SessionRow:
        return cls(
            id=row["id"],
            title=row["title"],
            persona=row["persona"],
            settings=json.loads(row["settings"]),
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            message_count=row["message_count"],
            closed=bool(row["closed"]),
            draft=row["draft"],
            system_prompt=row["system_prompt"],
        )


@dataclass(frozen=True)
class MessageRow:
    """One message. parent_id: the message it follows (None at the top of the chat);
    position: its depth (0 at the top); kept: the current one of its siblings."""

    id: int
    session_id: int
    parent_id: int | None
    position: int
    role: str
    content: str
    status: str
    metadata: dict[str, Any]
    kept: bool
    created_at: str

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> MessageRow:
        return cls(
            id=row["id"],
            session_id=row["session_id"],
            parent_id=row["parent_id"],
            position=row["position"],
            role=row["role"],
            content=row["content"],
            status=row["status"],
            metadata=json.loads(row["metadata"]),
            kept=bool(row["kept"]),
            created_at=row["created_at"],
        )


@dataclass(frozen=True)
class NewMessage:
    """A message for `Store.insert_session`: `parent` is the index of the message it follows
    in the same call (None at the top); of siblings, the last `kept` one is current."""

    role: str
    content: str
    status: str = "done"
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    parent: int | None = None
    kept: bool = True


@dataclass(frozen=True)
class SearchHit:
    """A message matching a search; snippet marks the matches with SNIPPET_MARKS."""

    session_id: int
    session_title: str
    message_id: int
    role: str
    snippet: str

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> SearchHit:
        return cls(
            session_id=row["session_id"],
            session_title=row["title"],
            message_id=row["id"],
            role=row["role"],
            snippet=row["snippet"],
        )
