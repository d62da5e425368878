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
what was still streaming "interrupted". `restore` rebuilds the open chats from the store.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, fields, replace
from typing import Any

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
from chatpage.chat.entry import Attachment, Entry, ReplyStats, ToolRun, ToolStep
from chatpage.chat.sampling import SamplingSettings
from chatpage.chat.session import ChatSession
from chatpage.chat.tree import below
from chatpage.config.errorlog import log_error
from chatpage.config.personas import Persona, find_persona
from chatpage.store import NotFound, SessionRow, Store
from chatpage.vocab import MessageStatus

SAVE_INTERVAL_S = 2.0
"""The longest a streaming reply's text waits before it is written."""

_STATS_KEYS = tuple(f.name for f in fields(ReplyStats))


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


# -- what is saved --------------------------------------------------------------------------------


def settings_dict(session: ChatSession) -> dict[str, float | int | bool | None]:
    """A chat's own settings: its sampling, and /think's choice where one was made."""
    saved: dict[str, float | int | bool | None] = asdict(session.sampling)
    if session.thinking is not None:
        saved["thinking"] = session.thinking
    return saved


def user_metadata(entry: Entry) -> dict[str, object]:
    if not entry.attachments:
        return {}
    return {"attachments": [{"name": a.name, "text": a.text} for a in entry.attachments]}


def reply_metadata(entry: Entry) -> dict[str, object]:
    meta: dict[str, object] = dict(entry.stats.as_dict()) if entry.stats is not None else {}
    if entry.label is not None:
        meta["label"] = entry.label
    if entry.error is not None:
        meta["error"] = entry.error
    if entry.token_ids is not None and entry.token_source is not None:
        meta["token_ids"] = list(entry.token_ids)
        meta["token_source"] = entry.token_source
    if entry.reasoning:
        meta["reasoning"] = entry.reasoning
        meta["reasoning_tokens"] = entry.reasoning_tokens
    if entry.steps:  # the assistant's tool_calls and the tool results, round by round
        meta["tool_steps"] = [
            {"text": step.text, "calls": [asdict(run) for run in step.runs]} for step in entry.steps
        ]
    return meta


def _steps(raw: Any) -> list[ToolStep]:
    """Saved tool rounds (a malformed one is left out); a call that never resolved (the app
    stopped meanwhile) reads as not run."""
    steps = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("calls"), list):
            continue
        runs = []
        for c in item["calls"]:
            if isinstance(c, dict) and all(isinstance(c.get(k), str) for k in _RUN_KEYS):
                run = ToolRun(c["id"], c["name"], c["arguments"], result=str(c.get("result", "")))
                state, took = c.get("state"), c.get("elapsed_s")
                run.state = state if state in ("done", "failed", "denied") else "denied"
                run.elapsed_s = float(took) if isinstance(took, int | float) else 0.0
                runs.append(run)
        steps.append(ToolStep(str(item.get("text", "")), runs))
    return steps


_RUN_KEYS = ("id", "name", "arguments")


# -- what comes back ------------------------------------------------------------------------------


def restore(
    store: Store, personas: list[Persona], fallback: Persona, first_id: int
) -> tuple[list[ChatSession], list[str]]:
    """The chats that were open, most recent first, as sessions numbered from ``first_id``,
    plus one-line notes (a persona that is gone). Replies a crash left "streaming" are marked
    "interrupted" first."""
    store.mark_streaming_interrupted()
    sessions: list[ChatSession] = []
    notes: list[str] = []
    for row in store.list_sessions(closed=False):
        session, note = load_session(store, row, personas, fallback, first_id + len(sessions))
        if session is not None:
            sessions.append(session)
        if note:
            notes.append(note)
    return sessions, notes


def load_session(
    store: Store, row: SessionRow, personas: list[Persona], fallback: Persona, session_id: int
) -> tuple[ChatSession | None, str | None]:
    """One saved chat as a session (every branch, each fork showing the version that was on
    show), and a note if its persona is gone; None and a note naming the chat if it cannot be
    read (it stays saved: one chat must not keep the others from opening)."""
    try:
        return _load(store, row, personas, fallback, session_id)
    except Exception as err:  # saved by an older or another program: whatever it holds
        why = log_error(err, f"opening the saved chat {row.id}")
        return None, (
            f"the saved chat {row.title[:60]!r} cannot be opened ({why}); it stays saved: "
            f"`chatpage export {row.id} --format json` writes it out"
        )


def _load(
    store: Store, row: SessionRow, personas: list[Persona], fallback: Persona, session_id: int
) -> tuple[ChatSession, str | None]:
    persona = find_persona(personas, row.persona)
    note = None
    if persona is None:
        persona = fallback
        note = (
            f"chat {row.title!r} used the persona {row.persona!r}, which is gone; "
            f"it continues with {fallback.name!r}"
        )
    if row.system_prompt is not None:  # its own, set with /system
        persona = replace(persona, system_prompt=row.system_prompt)
    session = ChatSession(
        session_id,
        persona,
        title=row.title,
        sampling=sampling_from(row.settings, persona),
        store_id=row.id,
    )
    thinking = row.settings.get("thinking")
    session.thinking = thinking if isinstance(thinking, bool) else None
    nodes: dict[int | None, Entry | None] = {None: None}  # a system message stands for its parent
    for m in store.messages(row.id):  # parents come before their children
        if m.parent_id not in nodes:
            continue
        parent = nodes[m.parent_id]
        if m.role == "system":
            nodes[m.id] = parent
            continue
        entry = entry_from(m.role, m.content, m.status, m.metadata, m.id)
        nodes[m.id] = session.transcript.attach(entry, parent, current=m.kept)
    typed = sorted((e for e in session.transcript if e.role == "user" and e.content), key=saved_id)
    session.history = [e.content for e in typed]
    return session, note


def saved_id(entry: Entry) -> int:
    """The row of a message that has been saved."""
    if entry.store_id is None:
        raise ValueError("the message has not been saved")
    return entry.store_id


def entry_from(
    role: str, content: str, status: str, meta: dict[str, Any], message_id: int
) -> Entry:
    if status == MessageStatus.STREAMING:  # another chatpage may still be writing it
        status = MessageStatus.INTERRUPTED
    if role == "user":
        saved = meta.get("attachments")
        attachments = [
            Attachment(str(a.get("name", "file")), str(a.get("text", "")))
            for a in (saved if isinstance(saved, list) else [])
            if isinstance(a, dict)
        ]
        return Entry(
            "user", content, MessageStatus(status), attachments=attachments, store_id=message_id
        )
    numbers: dict[str, Any] = {
        k: meta[k]
        for k in _STATS_KEYS
        if isinstance(meta.get(k), int | float) and not isinstance(meta[k], bool)
    }
    stats = ReplyStats(**numbers) if "tokens" in numbers else None
    label, error = meta.get("label"), meta.get("error")
    reasoning, thought = meta.get("reasoning"), meta.get("reasoning_tokens")
    ids, source = meta.get("token_ids"), meta.get("token_source")
    known = (
        isinstance(ids, list)
        and isinstance(source, str)
        and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    )
    return Entry(
        "assistant",
        content,
        MessageStatus(status),
        stats=stats,
        label=label if isinstance(label, str) else None,
        error=error if isinstance(error, str) else None,
        store_id=message_id,
        token_ids=tuple(ids) if known and isinstance(ids, list) else None,
        token_source=source if known else None,
        reasoning=reasoning if isinstance(reasoning, str) else "",
        reasoning_tokens=thought
        if isinstance(thought, int) and not isinstance(thought, bool)
        else 0,
        steps=_steps(meta.get("tool_steps")),
    )


def sampling_from(saved: dict[str, Any], persona: Persona) -> SamplingSettings:
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
