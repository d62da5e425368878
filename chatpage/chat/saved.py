"""A chat as the store keeps it, both ways: what is saved of its settings and messages (the
`Recorder` writes them), and the sessions rebuilt from the rows at start (`restore`).

What the store holds may come from an older chatpage or another program on the same database:
reading it back keeps what is well-formed and drops the rest, never the whole chat.
"""

from __future__ import annotations

from dataclasses import asdict, fields, replace
from typing import Any

from chatpage.chat.entry import Attachment, Entry, ReplyStats, ToolRun, ToolStep
from chatpage.chat.sampling import SamplingSettings
from chatpage.chat.session import ChatSession
from chatpage.config.errorlog import log_error
from chatpage.config.personas import Persona, find_persona
from chatpage.store import SessionRow, Store
from chatpage.vocab import MessageStatus

_STATS_KEYS = tuple(f.name for f in fields(ReplyStats))


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
