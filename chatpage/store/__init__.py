"""Chats saved in SQLite under the XDG data dir: the store, its schema, export and import."""

from chatpage.store.rows import (
    MessageRow,
    NewMessage,
    NotFound,
    SearchHit,
    SessionRow,
)
from chatpage.store.store import DB_NAME, SNIPPET_MARKS, Store, make_title

__all__ = [
    "DB_NAME",
    "SNIPPET_MARKS",
    "MessageRow",
    "NewMessage",
    "NotFound",
    "SearchHit",
    "SessionRow",
    "Store",
    "make_title",
]
