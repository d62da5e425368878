"""Chats saved as they happen, and brought back at start.

`Recorder` is one of `Chats.observers`: every change of every session reaches it, and it writes
what matters to the `Store` on the UI thread (SQLite in WAL mode: a write is a fraction of a
millisecond). What is saved when:

- a chat is created in the store with its first message (an empty chat is never saved);
- the user's message at send; a reply when it is added (status "streaming"), then its text at
  most every `SAVE_INTERVAL_S` while it streams (on the next update, or on `flush`, which the
  app calls on a timer), and at once when it ends ("done", "stopped", "error");
- alternatives when one is kept: every pane becomes a sibling of one reply, the kept one marked;
- title, sampling settings, a dropped end of the transcript (edit, regenerate, clear), and a
  closed chat (kept in the history, not reopened at start).

A crash loses at most the last `SAVE_INTERVAL_S` of a reply; at the next start the store marks
what was still streaming "interrupted". `restore` rebuilds the open chats from the store.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, fields

from chatpage.chat.session import (
    Attachment,
    Candidate,
    Change,
    ChatSession,
    Entry,
    Generation,
    ReplyStats,
    SamplingSettings,
)
from chatpage.config.personas import Persona, find_persona
from chatpage.store import SessionRow, Store

SAVE_INTERVAL_S = 2.0
"""The longest a streaming reply's text waits before it is written."""

_STATS_KEYS = tuple(f.name for f in fields(ReplyStats))


class Recorder:
    """Writes session changes to a store. Call it as an observer: ``recorder(session, change)``.

    A failed write never stops the app: ``report`` gets one line (once per distinct problem).
    """

    def __init__(self, store: Store, report: Callable[[str], None] = lambda _line: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.report = report
        self._clock = clock
        self._streaming: dict[int, Entry] = {}  # message id -> reply saved as "streaming"
        self._saved_at: dict[int, float] = {}  # message id -> when its text was last written
        self._dirty: set[int] = set()  # streaming replies changed since their last write
        self._alternatives: dict[int, Generation] = {}  # session id -> panes on show
        self._reported: set[str] = set()

    def __call__(self, session: ChatSession, change: Change) -> None:
        try:
            self._record(session, change)
        except (sqlite3.Error, KeyError, ValueError) as err:
            self._fail(err)

    def _fail(self, err: BaseException) -> None:
        line = f"could not save the chat: {err}"
        if line not in self._reported:
            self._reported.add(line)
            self.report(line)

    def _record(self, session: ChatSession, change: Change) -> None:
        kind, entry = change.kind, change.entry
        if kind == "closed":
            self._alternatives.pop(session.id, None)
        if kind == "generation" and session.choosing:
            self._alternatives[session.id] = session.generation
        elif kind == "entry_added" and entry is not None:
            self._add(session, entry)
        elif session.store_id is None:
            return  # nothing saved yet: the first message creates the chat
        elif kind == "entry_updated" and entry is not None and entry.store_id is not None:
            if entry.status == "streaming":
                self._due(entry)
            else:
                self._write(entry)
        elif kind == "entries_reset":
            self._drop_end(session)
        elif kind == "title":
            self.store.rename_session(session.store_id, session.title)
        elif kind == "settings":
            self.store.update_session(session.store_id, settings=settings_dict(session.sampling))
        elif kind == "closed":
            self.store.set_closed(session.store_id, True)

    # -- messages ----------------------------------------------------------------------------------
    def _chat(self, session: ChatSession) -> int:
        if session.store_id is None:
            session.store_id = self.store.create_session(
                session.title, session.persona.name, settings_dict(session.sampling))
        return session.store_id

    def _add(self, session: ChatSession, entry: Entry) -> None:
        chat = self._chat(session)
        if entry.role == "user":
            entry.store_id = self.store.add_message(chat, "user", entry.content,
                                                    metadata=user_metadata(entry))
            return
        generation = self._alternatives.pop(session.id, None)
        if entry.label is not None and generation is not None:
            entry.store_id = self._add_alternatives(chat, entry, generation.candidates)
            return
        entry.store_id = self.store.add_message(chat, "assistant", entry.content, entry.status,
                                                reply_metadata(entry))
        if entry.status == "streaming":
            self._streaming[entry.store_id] = entry
            self._saved_at[entry.store_id] = self._clock()

    def _add_alternatives(self, chat: int, kept: Entry, candidates: list[Candidate]) -> int:
        """The kept reply first (so the group always has its kept one), then its siblings."""
        kept_id = self.store.add_message(chat, "assistant", kept.content, kept.status,
                                         reply_metadata(kept))
        for cand in candidates:
            if cand.label != kept.label:
                self.store.add_message(chat, "assistant", cand.text, candidate_status(cand),
                                       candidate_metadata(cand), group_id=kept_id, kept=False)
        return kept_id

    def _due(self, entry: Entry) -> None:
        """A streaming reply changed: write it if its last write is old enough."""
        last = self._saved_at.get(entry.store_id)
        if last is None or self._clock() - last >= SAVE_INTERVAL_S:
            self._write(entry)
        else:
            self._dirty.add(entry.store_id)

    def _write(self, entry: Entry, status: str | None = None) -> None:
        message_id = entry.store_id
        status = status or entry.status
        self.store.update_message(message_id, entry.content, status, reply_metadata(entry))
        self._saved_at[message_id] = self._clock()
        self._dirty.discard(message_id)
        if status != "streaming":
            self._forget(message_id)

    def _forget(self, message_id: int | None) -> None:
        self._streaming.pop(message_id, None)
        self._saved_at.pop(message_id, None)
        self._dirty.discard(message_id)

    def _drop_end(self, session: ChatSession) -> None:
        last = next((e.store_id for e in reversed(session.entries) if e.store_id is not None),
                    None)
        self.store.truncate_after(session.store_id, last)
        alive = {e.store_id for e in session.entries}
        for message_id in [m for m in self._streaming if m not in alive]:
            self._forget(message_id)

    # -- for the app ---------------------------------------------------------------------------------
    def flush(self, force: bool = False) -> None:
        """Write the streaming replies whose text changed since their last write, once that
        write is `SAVE_INTERVAL_S` old (at once with ``force``)."""
        now = self._clock()
        for message_id in list(self._dirty):
            entry = self._streaming.get(message_id)
            if entry is not None and (
                    force or now - self._saved_at.get(message_id, now) >= SAVE_INTERVAL_S):
                try:
                    self._write(entry)
                except (sqlite3.Error, KeyError) as err:
                    self._fail(err)

    def finish(self) -> None:
        """At quit: replies still streaming are saved as "interrupted" with their text."""
        for entry in list(self._streaming.values()):
            try:
                self._write(entry, "interrupted")
            except (sqlite3.Error, KeyError) as err:
                self._fail(err)

    def delete(self, session: ChatSession) -> None:
        """Delete the session's chat from the store; it is not saved again."""
        chat, session.store_id = session.store_id, None
        self._alternatives.pop(session.id, None)
        for entry in session.entries:
            self._forget(entry.store_id)
        if chat is not None:
            try:
                self.store.delete_session(chat)
            except (sqlite3.Error, KeyError) as err:
                self._fail(err)


# -- what is saved --------------------------------------------------------------------------------

def settings_dict(sampling: SamplingSettings) -> dict[str, float | int | None]:
    return asdict(sampling)


def user_metadata(entry: Entry) -> dict[str, object]:
    if not entry.attachments:
        return {}
    return {"attachments": [{"name": a.name, "text": a.text} for a in entry.attachments]}


def reply_metadata(entry: Entry) -> dict[str, object]:
    meta: dict[str, object] = entry.stats.as_dict() if entry.stats is not None else {}
    if entry.label is not None:
        meta["label"] = entry.label
    if entry.error is not None:
        meta["error"] = entry.error
    return meta


def candidate_status(cand: Candidate) -> str:
    if cand.error is not None or cand.finish_reason == "error":
        return "error"
    return "stopped" if cand.finish_reason in (None, "abort") else "done"


def candidate_metadata(cand: Candidate) -> dict[str, object]:
    entry = Entry("assistant", cand.text, stats=cand.stats, label=cand.label, error=cand.error)
    return reply_metadata(entry)


# -- what comes back ------------------------------------------------------------------------------

def restore(store: Store, personas: list[Persona], fallback: Persona,
            first_id: int) -> tuple[list[ChatSession], list[str]]:
    """The chats that were open, most recent first, as sessions numbered from ``first_id``,
    plus one-line notes (a persona that is gone). Replies a crash left "streaming" are marked
    "interrupted" first."""
    store.mark_streaming_interrupted()
    sessions: list[ChatSession] = []
    notes: list[str] = []
    for row in store.list_sessions(closed=False):
        session, note = load_session(store, row, personas, fallback, first_id + len(sessions))
        sessions.append(session)
        if note:
            notes.append(note)
    return sessions, notes


def load_session(store: Store, row: SessionRow, personas: list[Persona], fallback: Persona,
                 session_id: int) -> tuple[ChatSession, str | None]:
    """One saved chat as a session (its kept transcript), and a note if its persona is gone."""
    persona = find_persona(personas, row.persona)
    note = None
    if persona is None:
        persona = fallback
        note = (f"chat {row.title!r} used the persona {row.persona!r}, which is gone; "
                f"it continues with {fallback.name!r}")
    entries = [entry_from(m.role, m.content, m.status, m.metadata, m.id)
               for m in store.messages(row.id, kept_only=True) if m.role in ("user", "assistant")]
    session = ChatSession(session_id, persona, title=row.title, entries=entries,
                          sampling=sampling_from(row.settings, persona), store_id=row.id)
    session.history = [e.content for e in entries if e.role == "user" and e.content]
    return session, note


def entry_from(role: str, content: str, status: str, meta: dict, message_id: int) -> Entry:
    if status == "streaming":  # another chatpage may still be writing it; shown as cut off
        status = "interrupted"
    if role == "user":
        attachments = [Attachment(str(a.get("name", "file")), str(a.get("text", "")))
                       for a in meta.get("attachments", []) if isinstance(a, dict)]
        return Entry("user", content, status, attachments=attachments, store_id=message_id)
    numbers = {k: meta[k] for k in _STATS_KEYS
               if isinstance(meta.get(k), int | float) and not isinstance(meta[k], bool)}
    stats = ReplyStats(**numbers) if "tokens" in numbers else None
    label, error = meta.get("label"), meta.get("error")
    return Entry("assistant", content, status, stats=stats,
                 label=label if isinstance(label, str) else None,
                 error=error if isinstance(error, str) else None, store_id=message_id)


def sampling_from(saved: dict, persona: Persona) -> SamplingSettings:
    """The saved settings over the persona's defaults (a value that no longer passes is
    dropped)."""
    sampling = SamplingSettings.for_persona(persona)
    for info in fields(SamplingSettings):
        if info.name in saved:
            try:
                sampling = sampling.with_value(info.name, saved[info.name])
            except ValueError:
                continue
    return sampling
