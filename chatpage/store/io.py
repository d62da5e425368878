"""Chats in and out of the store: Markdown (to read) and JSON (everything, to import again).

The JSON export is ``{"format": "chatpage-session", "version": 2, ...}`` with the chat's title,
persona, settings, own system prompt (null: the persona's) and timestamps and every message of every branch: each has an ``id`` (its
number in the file) and the ``parent`` it follows (null at the top); of siblings, the ``kept``
one is current. `import_json` reads it back exactly, and still reads version 1 (a linear chat
whose alternatives share a ``group`` number), which becomes a chain.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from chatpage.store.rows import MessageRow, NewMessage, NotFound, SessionRow
from chatpage.store.store import Store
from chatpage.store.validate import TOO_DEEP, check_depth, message_metadata

EXPORT_FORMAT = "chatpage-session"
EXPORT_VERSION = 2
FORMATS = ("md", "json")


def export_session(store: Store, session_id: int, fmt: Literal["md", "json"]) -> str:
    """The chat as Markdown (the kept transcript, for reading) or JSON (everything, for
    `import_json`). NotFound for an unknown chat, ValueError for an unknown format."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use 'md' or 'json'")
    session = store.get_session(session_id)
    if session is None:
        raise NotFound(f"no chat with id {session_id}")
    messages = store.messages(session_id)
    return _to_json(session, messages) if fmt == "json" else _to_markdown(session, messages)


def write_whole(path: Path, text: str, *, replace: bool = True) -> None:
    """Write ``text`` to ``path`` all or nothing: into a temporary file beside it, flushed to
    disk, then renamed over it (``replace``) or linked to it (never overwriting: FileExistsError
    when it exists). A failure, such as a full disk, leaves no partial file behind."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if replace:
            os.replace(tmp, path)
            return
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # a file system without hard links: check, then rename
            if path.exists():
                raise FileExistsError(path) from None
            os.replace(tmp, path)
    finally:
        with suppress(FileNotFoundError):
            os.unlink(tmp)


def import_json(store: Store, text: str) -> int:
    """Add a chat from `export_session(..., "json")` output; returns the new chat's id.
    Raises ValueError with a one-line reason (and adds nothing) if the text is not such an
    export."""
    chat, messages = _parse_export(text)
    return store.insert_session(
        chat["title"],
        chat["persona"],
        chat["settings"],
        messages,
        chat["created_at"],
        chat["updated_at"],
        chat["system_prompt"],
    )


def local_time(stamp: str) -> str:
    """A stored UTC timestamp as local "YYYY-MM-DD HH:MM" (unchanged if it is not ISO 8601)."""
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp


def _to_json(session: SessionRow, messages: list[MessageRow]) -> str:
    numbers = {m.id: n for n, m in enumerate(messages, 1)}
    doc = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "title": session.title,
        "persona": session.persona,
        "settings": session.settings,
        "system_prompt": session.system_prompt,
        "created_at": session.created_at,
        "updated_at": session.updated_at,
        "messages": [
            {
                "id": numbers[m.id],
                "role": m.role,
                "parent": None if m.parent_id is None else numbers.get(m.parent_id),
                "content": m.content,
                "status": m.status,
                "metadata": m.metadata,
                "created_at": m.created_at,
                "kept": m.kept,
            }
            for m in messages
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _to_markdown(session: SessionRow, messages: list[MessageRow]) -> str:
    lines = [
        f"# {session.title}",
        "",
        f"- Persona: {session.persona}",
        f"- Started: {local_time(session.created_at)}",
        f"- Updated: {local_time(session.updated_at)}",
    ]
    if session.settings:
        listed = ", ".join(f"{k}={v}" for k, v in session.settings.items())
        lines.append(f"- Settings: {listed}")
    if session.system_prompt is not None:
        lines += ["", "## System (this chat's own)", "", session.system_prompt.rstrip("\n")]
    versions: dict[int | None, int] = {}
    for msg in messages:
        versions[msg.parent_id] = versions.get(msg.parent_id, 0) + 1
    active = {m.id for m in messages if m.kept}
    for msg in messages:
        if not msg.kept or (msg.parent_id is not None and msg.parent_id not in active):
            continue
        active.add(msg.id)
        lines += ["", f"## {msg.role.capitalize()}"]
        lines += _thinking_lines(msg.metadata) + _tool_lines(msg.metadata)
        lines += ["", msg.content.rstrip("\n")]
        if msg.status != "done":
            lines += ["", f"*({msg.status})*"]
        if versions[msg.parent_id] > 1:
            lines += [
                "",
                f"*(1 of {versions[msg.parent_id]} versions; the JSON export has all of them)*",
            ]
    return "\n".join(lines) + "\n"


def _thinking_lines(meta: dict[str, Any]) -> list[str]:
    """A reply's saved thinking, as a quote under a one-line heading."""
    thought = meta.get("reasoning")
    if not isinstance(thought, str) or not thought.strip():
        return []
    tokens = meta.get("reasoning_tokens")
    head = f"*Thought for {tokens} tokens:*" if isinstance(tokens, int) else "*Thought:*"
    return ["", head, ""] + [f"> {line}".rstrip() for line in thought.strip("\n").split("\n")]


def _tool_lines(meta: dict[str, Any]) -> list[str]:
    """A reply's saved tool rounds (recorder's ``tool_steps``): each round's text, then each
    call with its arguments and result in code blocks."""
    lines: list[str] = []
    steps = meta.get("tool_steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, dict):
            continue
        text = step.get("text")
        if isinstance(text, str) and text.strip():
            lines += ["", text.strip("\n")]
        calls = step.get("calls")
        for call in calls if isinstance(calls, list) else []:
            if not isinstance(call, dict):
                continue
            took = call.get("elapsed_s")
            timing = f", {took:.2f} s" if isinstance(took, int | float) and took else ""
            lines += ["", f"**Tool call `{call.get('name')}`** ({call.get('state')}{timing})"]
            lines += _code(str(call.get("arguments", "")), "json")
            lines += ["", "Result:"] + _code(str(call.get("result", "")), "text")
    return lines


def _code(text: str, lang: str) -> list[str]:
    """``text`` as a fenced block whose fence is longer than any run of backticks in it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return ["", f"{fence}{lang}", text.rstrip("\n"), fence]


def _parse_export(text: str) -> tuple[dict[str, Any], list[NewMessage]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}"
        ) from None
    except RecursionError:  # (the parser's own limit, near 1000 levels)
        raise ValueError(TOO_DEEP) from None
    check_depth(data)
    if not isinstance(data, dict) or data.get("format") != EXPORT_FORMAT:
        raise ValueError(
            f'not a chatpage export: expected a JSON object with "format": "{EXPORT_FORMAT}"'
        )
    version = data.get("version")
    if not isinstance(version, int) or not 1 <= version <= EXPORT_VERSION:
        raise ValueError(
            f"unsupported export version {version!r}; this chatpage reads "
            f"versions 1 to {EXPORT_VERSION}"
        )
    chat = {
        "title": _field(data, "title", str, "the chat"),
        "persona": _field(data, "persona", str, "the chat"),
        "settings": _field(data, "settings", dict, "the chat", {}),
        "created_at": _field(data, "created_at", str, "the chat", None),
        "updated_at": _field(data, "updated_at", str, "the chat", None),
        "system_prompt": data.get("system_prompt"),
    }
    if not isinstance(chat["system_prompt"], str | None):
        raise ValueError("the chat: 'system_prompt' must be text or null")
    raw = _field(data, "messages", list, "the chat")
    for n, msg in enumerate(raw, 1):
        if not isinstance(msg, dict):
            raise ValueError(f"message {n} is not a JSON object")
    parents = _parents_v1(raw) if version == 1 else _parents(raw)
    messages = [
        NewMessage(
            role=_field(msg, "role", str, f"message {n}"),
            content=_field(msg, "content", str, f"message {n}"),
            status=_field(msg, "status", str, f"message {n}", "done"),
            metadata=message_metadata(
                _field(msg, "metadata", dict, f"message {n}", {}), f"message {n}"
            ),
            created_at=_field(msg, "created_at", str, f"message {n}", None),
            parent=parent,
            kept=_field(msg, "kept", bool, f"message {n}", True),
        )
        for n, (msg, parent) in enumerate(zip(raw, parents, strict=True), 1)
    ]
    return chat, messages


def _whole(msg: dict[str, Any], key: str, where: str) -> int | None:
    value = msg.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{where}: {key!r} must be a whole number or null")
    return value


def _parents(raw: list[dict[str, Any]]) -> list[int | None]:
    """Version 2: each message's parent as an index into the list (it must come earlier)."""
    index: dict[int, int] = {}
    parents: list[int | None] = []
    for n, msg in enumerate(raw, 1):
        where = f"message {n}"
        number, parent = _whole(msg, "id", where), _whole(msg, "parent", where)
        if number is None or number in index:
            raise ValueError(f"{where}: 'id' must be a whole number used once")
        if parent is not None and parent not in index:
            raise ValueError(f"{where}: 'parent' must be the id of an earlier message")
        parents.append(None if parent is None else index[parent])
        index[number] = n - 1
    return parents


def _parents_v1(raw: list[dict[str, Any]]) -> list[int | None]:
    """Version 1, a linear chat: each turn follows the kept message of the turn before; the
    messages sharing a `group` are one turn (alternatives, siblings)."""
    parents: list[int | None] = []
    turn_parent: int | None = None  # the parent of the current turn
    last_kept: int | None = None  # the kept message of the current turn
    groups: dict[int, int | None] = {}  # group -> its turn's parent
    for n, msg in enumerate(raw, 1):
        group = _whole(msg, "group", f"message {n}")
        if group is None or group not in groups:
            turn_parent = last_kept if parents else None
            if group is not None:
                groups[group] = turn_parent
        parents.append(groups.get(group, turn_parent) if group is not None else turn_parent)
        if msg.get("kept", True) is not False or group is None:
            last_kept = n - 1
    return parents


_MISSING = object()


def _field(data: dict[str, Any], key: str, kind: type, where: str, default: Any = _MISSING) -> Any:
    value = data.get(key, _MISSING)
    if value is _MISSING and default is not _MISSING:
        return default
    if not isinstance(value, kind):
        names = {str: "text", dict: "an object", list: "a list", bool: "true or false"}
        raise ValueError(f"{where}: {key!r} must be {names[kind]}")
    return value
