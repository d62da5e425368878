"""What an imported chat's messages may hold, checked before anything is saved.

A message's metadata is what ``chat/recorder.py`` writes (a user's attachments; a reply's
label, error, thinking, token ids, tool rounds and numbers); an import that gives one of those
keys a value of another kind is refused in one line naming the message and the key, so that no
saved chat fails to load later. Such a key given as null is dropped (null means "none"); keys
chatpage does not know are kept as they are.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32
"""How deep an import's JSON may nest (an export nests 8 levels at most)."""
TOO_DEEP = f"the JSON nests deeper than {MAX_DEPTH} levels; it is not a chatpage export"

_TEXT = (str, "text")
_WHOLE = (int, "a whole number")

# key -> (the kind its value must be, its name in the error); lists: of what
_KINDS: dict[str, tuple[type, str]] = {
    "label": _TEXT,
    "error": _TEXT,
    "reasoning": _TEXT,
    "token_source": _TEXT,
    "reasoning_tokens": _WHOLE,
    "attachments": (list, "a list of objects with text 'name' and 'text'"),
    "token_ids": (list, "a list of whole numbers"),
    "tool_steps": (list, "a list of objects with text 'text' and a list 'calls' of objects"),
}


def message_metadata(meta: dict[str, Any], where: str) -> dict[str, Any]:
    """``meta`` without the known keys given as null; ValueError naming ``where`` and the key
    when a known key holds a value of another kind."""
    meta = {k: v for k, v in meta.items() if v is not None or k not in _KINDS}
    for key, value in meta.items():
        kind, what = _KINDS.get(key, (object, "anything"))
        fits = type(value) is int if kind is int else isinstance(value, kind)
        if not fits or not _items_fit(key, value):
            raise ValueError(f"{where}: metadata {key!r} must be {what}")
    return meta


def check_depth(data: Any) -> None:
    """ValueError when ``data`` nests deeper than MAX_DEPTH (walked without recursion)."""
    level: list[Any] = [data]
    for _ in range(MAX_DEPTH + 1):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return
    raise ValueError(TOO_DEEP)


def _items_fit(key: str, value: Any) -> bool:
    if key == "attachments":
        return all(_texts(a, ("name", "text")) for a in value)
    if key == "token_ids":
        return all(type(i) is int for i in value)
    if key == "tool_steps":
        return all(
            _texts(step, ("text",))
            and isinstance(step.get("calls"), list)
            and all(isinstance(call, dict) for call in step["calls"])
            for step in value
        )
    return True


def _texts(item: Any, keys: tuple[str, ...]) -> bool:
    return isinstance(item, dict) and all(isinstance(item.get(k, ""), str) for k in keys)
