"""Chats saved in SQLite under the XDG data dir: the store, its schema, export and import."""

from chatpage.store.rows import (
    MessageRow,
    MessageStatus,
    NewMessage,
    NotFound,
    Role,
    SearchHit,
    SessionRow,
)
from chatpage.store.store import DB_NAME, SNIPPET_MARKS, Store, make_title

__all__ = ["DB_NAME", "SNIPPET_MARKS", "MessageRow", "MessageStatus", "NewMessage", "NotFound",
           "Role", "SearchHit", "SessionRow", "Store", "make_title"]
