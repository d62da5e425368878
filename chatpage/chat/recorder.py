"""Chats saved as they happen, and brought back at start.

`Recorder` is one of `Chats.observers`: every change of every session reaches it, and it writes
what matters to the `Store` on the UI thread (SQLite in WAL mode: a write is a fraction of a
millisecond). What is saved when:

- a chat is created in the store with its first message, its first draft or its own system
  prompt (`keep_draft`, `keep_system_prompt`); an empty chat whose draft is emptied again is
  removed (one with nothing to keep is never saved), unless the store holds a message or a
  system prompt for it that another chatpage on the same database added;
- every message when it is added, under its parent (the messages form a tree, as in the
  session): the user's at send, a reply at once (status "streaming"), then its text at most
  every `SAVE_INTERVAL_S` while it streams (on the next update, or on `flush`, which the app
  calls on a timer), and at once when it ends ("done", "stopped", "error"); alternatives when
  one is kept, each a version of the reply;
- which version is on show at each fork (after an edit, a regenerate, a switch), a deleted
  message (with what followed it, and the version the tree shows in its place; an undo writes
  them again), a cleared
  chat, the title, sampling settings, and a closed chat (kept in the history, not reopened at
  start). Which version is current is always the session's tree's answer; the store is told
  it, never left to work it out.

A crash loses at most the last `SAVE_INTERVAL_S` of a reply; at the next start the store marks
what was still streaming "interrupted". `chatpage.chat.saved` is what a row holds, and
`restore` there rebuilds the open chats from the store.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from chatpage.chat.changes import (
    Change,
    Cleared,
    Closed,
    EntriesRestored,
    EntryAdded,
    EntryRemoved,
    EntryUpdated,
    PathChanged,
    SettingsChanged,
    TitleChanged,
)
from chatpage.chat.entry import Entry
from chatpage.chat.saved import reply_metadata, saved_id, settings_dict, user_metadata
from chatpage.chat.session import ChatSession
from chatpage.chat.tree import below
from chatpage.store import NotFound, Store
from chatpage.vocab import MessageStatus

SAVE_INTERVAL_S = 2.0
"""The longest a streaming reply's text waits before it is written."""


class Recorder:
    """Writes session changes to a store. Call it as an observer: ``recorder(session, change)``.

    A failed write never stops the app: ``report`` gets one line (once per distinct problem).
    """

    def __init__(
        self,
        store: Store,
        report: Callable[[str], None] = lambda _line: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.report = report
        self._clock = clock
        self._streaming: dict[int, Entry] = {}  # message id -> reply saved as "streaming"
        self._saved_at: dict[int, float] = {}  # message id -> when its text was last written
        self._dirty: set[int] = set()  # streaming replies changed since their last write
        self._reported: set[str] = set()

    def __call__(self, session: ChatSession, change: Change) -> None:
        try:
            self._record(session, change)
        except (sqlite3.Error, NotFound, ValueError) as err:
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        line = f"could not save the chat: {err}"
        if line not in self._reported:
            self._reported.add(line)
            self.report(line)

    def _record(self, session: ChatSession, change: Change) -> None:
        match change:
            case EntryAdded(entry):
                self._add(session, entry)
            case EntriesRestored(entry):  # an undone delete: its rows again, as they were
                for restored in below(entry):
                    self._add(session, restored)
                self._select_shown(session)
            case _ if session.store_id is None:
                return  # nothing saved yet: the first message creates the chat
            case EntryUpdated(entry) if entry.store_id is not None:
                if entry.status == MessageStatus.STREAMING:
                    self._due(entry)
                else:
                    self._write(entry)
            case PathChanged():
                self._select_shown(session)
            case EntryRemoved(entry, shown) if entry.store_id is not None:
                for gone in below(entry):
                    self._forget(gone.store_id)
                self.store.delete_message(
                    entry.store_id, shown=None if shown is None else shown.store_id
                )
            case Cleared():
                self._streaming.clear()
                self.store.clear_messages(session.store_id)
            case TitleChanged():
                self.store.rename_session(session.store_id, session.title)
            case SettingsChanged():
                self.store.update_session(session.store_id, settings=settings_dict(session))
            case Closed():
                self.store.set_closed(session.store_id, True)

    # -- messages ----------------------------------------------------------------------------------
    def _chat(self, session: ChatSession) -> int:
        if session.store_id is None:
            session.store_id = self.store.create_session(
                session.title, session.persona.name, settings_dict(session)
            )
        return session.store_id

    def _add(self, session: ChatSession, entry: Entry) -> None:
        chat = self._chat(session)
        parent = None if entry.parent is None else entry.parent.store_id
        if entry.parent is not None and parent is None:
            raise ValueError("the message it follows was not saved")
        shown = session.transcript.fork_of(entry).chosen() is entry
        if entry.role == "user":
            entry.store_id = self.store.add_message(
                chat,
                "user",
                entry.content,
                metadata=user_metadata(entry),
                parent_id=parent,
                kept=shown,
            )
            return
        entry.store_id = self.store.add_message(
            chat,
            "assistant",
            entry.content,
            entry.status,
            reply_metadata(entry),
            parent_id=parent,
            kept=shown,
        )
        if entry.status == MessageStatus.STREAMING:
            self._streaming[entry.store_id] = entry
            self._saved_at[entry.store_id] = self._clock()

    def _due(self, entry: Entry) -> None:
        """A streaming reply changed: write it if its last write is old enough."""
        message_id = saved_id(entry)
        self._streaming.setdefault(message_id, entry)  # a continued reply streams again
        last = self._saved_at.get(message_id)
        if last is None or self._clock() - last >= SAVE_INTERVAL_S:
            self._write(entry)
        else:
            self._dirty.add(message_id)

    def _write(self, entry: Entry, status: str | None = None) -> None:
        message_id = saved_id(entry)
        status = status or entry.status
        self.store.update_message(message_id, entry.content, status, reply_metadata(entry))
        self._saved_at[message_id] = self._clock()
        self._dirty.discard(message_id)
        if status != "streaming":
            self._forget(message_id)

    def _forget(self, message_id: int | None) -> None:
        if message_id is None:  # never saved
            return
        self._streaming.pop(message_id, None)
        self._saved_at.pop(message_id, None)
        self._dirty.discard(message_id)

    def _select_shown(self, session: ChatSession) -> None:
        """Save which version is on show at every fork of the path."""
        for entry in session.entries:
            if entry.store_id is not None and entry.place().forked:
                self.store.select(entry.store_id)

    # -- for the app ---------------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        """Write the streaming replies whose text changed since their last write, once that
        write is `SAVE_INTERVAL_S` old (at once with ``force``)."""
        now = self._clock()
        for message_id in list(self._dirty):
            entry = self._streaming.get(message_id)
            if entry is not None and (
                force or now - self._saved_at.get(message_id, now) >= SAVE_INTERVAL_S
            ):
                try:
                    self._write(entry)
                except (sqlite3.Error, NotFound) as err:
                    self._fail(err)

    def finish(self) -> None:
        """At quit: replies still streaming are saved as "interrupted" with their text."""
        for entry in list(self._streaming.values()):
            try:
                self._write(entry, MessageStatus.INTERRUPTED)
            except (sqlite3.Error, NotFound) as err:
                self._fail(err)

    def keep_draft(self, session: ChatSession) -> None:
        """Save ``session.draft`` with its chat (creating the chat for a first draft)."""
        try:
            if session.store_id is None and not session.draft:
                return
            chat = self._chat(session)
            if (
                not session.draft
                and next(iter(session.transcript), None) is None
                and self.store.delete_if_empty(chat)
            ):  # kept if another chatpage filled it
                session.store_id = None  # nothing left to keep
            else:
                self.store.set_draft(chat, session.draft)
        except (sqlite3.Error, NotFound) as err:
            self._fail(err)

    def keep_system_prompt(self, session: ChatSession, own: bool) -> None:
        """Save whether ``session`` runs with its own system prompt (``own``: the one its
        persona now holds, set with /system) or its persona's (after a persona switch)."""
        if session.store_id is None and not own:
            return
        try:
            self.store.set_system_prompt(
                self._chat(session), session.persona.system_prompt if own else None
            )
        except (sqlite3.Error, NotFound) as err:
            self._fail(err)

    def delete(self, session: ChatSession) -> None:
        """Delete the session's chat from the store; it is not saved again."""
        chat, session.store_id = session.store_id, None
        for entry in session.transcript:
            self._forget(entry.store_id)
        if chat is not None:
            try:
                self.store.delete_session(chat)
            except (sqlite3.Error, NotFound) as err:
                self._fail(err)
