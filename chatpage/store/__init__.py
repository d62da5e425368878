"""Chats saved in SQLite under the XDG data dir: the store, its schema, export and import."""

from chatpage.store.store import (
    DB_NAME,
    SNIPPET_MARKS,
    MessageRow,
    NewMessage,
    SearchHit,
    SessionRow,
    Store,
    make_title,
)

__all__ = ["DB_NAME", "SNIPPET_MARKS", "MessageRow", "NewMessage", "SearchHit", "SessionRow",
           "Store", "make_title"]
