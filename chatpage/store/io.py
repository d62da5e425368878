"""Chats in and out of the store: Markdown (to read) and JSON (everything, to import again).

The JSON export is ``{"format": "chatpage-session", "version": 1, ...}`` with the chat's title,
persona, settings and timestamps and every message, alternatives included (siblings share a
``group`` number, one of them ``kept``). `import_json` reads it back exactly.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from chatpage.store.rows import MessageRow, NewMessage, SessionRow
from chatpage.store.store import Store

EXPORT_FORMAT = "chatpage-session"
EXPORT_VERSION = 1
FORMATS = ("md", "json")


def export_session(store: Store, session_id: int, fmt: Literal["md", "json"]) -> str:
    """The chat as Markdown (the kept transcript, for reading) or JSON (everything, for
    `import_json`). KeyError for an unknown chat, ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use 'md' or 'json'")
    session = store.get_session(session_id)
    if session is None:
        raise KeyError(f"no chat with id {session_id}")
    messages = store.messages(session_id)
    return _to_json(session, messages) if fmt == "json" else _to_markdown(session, messages)


def import_json(store: Store, text: str) -> int:
    """Add a chat from `export_session(..., "json")` output; returns the new chat's id.
    Raises ValueError with a one-line reason (and adds nothing) if the text is not such an
    export."""
    chat, messages = _parse_export(text)
    return store.insert_session(chat["title"], chat["persona"], chat["settings"], messages,
                                chat["created_at"], chat["updated_at"])


def local_time(stamp: str) -> str:
    """A stored UTC timestamp as local "YYYY-MM-DD HH:MM" (unchanged if it is not ISO 8601)."""
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def _to_json(session: SessionRow, messages: list[MessageRow]) -> str:
    group_numbers: dict[int, int] = {}
    for msg in messages:
        if msg.group_id is not None:
            group_numbers.setdefault(msg.group_id, len(group_numbers) + 1)
    doc = {
        "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
        "title": session.title, "persona": session.persona, "settings": session.settings,
        "created_at": session.created_at, "updated_at": session.updated_at,
        "messages": [
            {"role": m.role, "content": m.content, "status": m.status, "metadata": m.metadata,
             "created_at": m.created_at,
             "group": None if m.group_id is None else group_numbers[m.group_id],
             "kept": m.kept}
            for m in messages
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _to_markdown(session: SessionRow, messages: list[MessageRow]) -> str:
    lines = [f"# {session.title}", "",
             f"- Persona: {session.persona}",
             f"- Started: {local_time(session.created_at)}",
             f"- Updated: {local_time(session.updated_at)}"]
    if session.settings:
        listed = ", ".join(f"{k}={v}" for k, v in session.settings.items())
        lines.append(f"- Settings: {listed}")
    siblings: dict[int, int] = {}
    for msg in messages:
        if msg.group_id is not None:
            siblings[msg.group_id] = siblings.get(msg.group_id, 0) + 1
    for msg in messages:
        if not msg.kept:
            continue
        lines += ["", f"## {msg.role.capitalize()}", "", msg.content.rstrip("\n")]
        if msg.status != "done":
            lines += ["", f"*({msg.status})*"]
        if msg.group_id is not None and siblings[msg.group_id] > 1:
            lines += ["", f"*(1 of {siblings[msg.group_id]} alternatives; the JSON export has "
                          "all of them)*"]
    return "\n".join(lines) + "\n"


def _parse_export(text: str) -> tuple[dict[str, Any], list[NewMessage]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON (line {err.lineno}, column {err.colno}): "
                         f"{err.msg}") from None
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ValueError("not a chatpage export: expected a JSON object with "
                         f'"format": "{EXPORT_FORMAT}"')
    if not isinstance(data.get("version"), int) or data["version"] > EXPORT_VERSION:
        raise ValueError(f"unsupported export version {data.get('version')!r}; this chatpage "
                         f"reads version {EXPORT_VERSION}")
    chat = {
        "title": _field(data, "title", str, "the chat"),
        "persona": _field(data, "persona", str, "the chat"),
        "settings": _field(data, "settings", dict, "the chat", {}),
        "created_at": _field(data, "created_at", str, "the chat", None),
        "updated_at": _field(data, "updated_at", str, "the chat", None),
    }
    messages = []
    for n, msg in enumerate(_field(data, "messages", list, "the chat"), 1):
        where = f"message {n}"
        if not isinstance(msg, dict):
            raise ValueError(f"{where} is not a JSON object")
        group = msg.get("group")
        if group is not None and (not isinstance(group, int) or isinstance(group, bool)):
            raise ValueError(f"{where}: 'group' must be a whole number or null")
        messages.append(NewMessage(
            role=_field(msg, "role", str, where),
            content=_field(msg, "content", str, where),
            status=_field(msg, "status", str, where, "done"),
            metadata=_field(msg, "metadata", dict, where, {}),
            created_at=_field(msg, "created_at", str, where, None),
            group=group,
            kept=_field(msg, "kept", bool, where, True),
        ))
    return chat, messages


_MISSING = object()


def _field(data: dict[str, Any], key: str, kind: type, where: str,
           default: Any = _MISSING) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING and default is not _MISSING:
        return default
    if not isinstance(value, kind):
        names = {str: "text", dict: "an object", list: "a list", bool: "true or false"}
        raise ValueError(f"{where}: {key!r} must be {names[kind]}")
    return value
