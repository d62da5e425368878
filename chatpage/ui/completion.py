"""Tab completion in the message box: slash commands, persona names, and /file paths.

`completions` gives every full text the line could become; `PromptInput` applies them (the
common prefix first, then one after another on each further tab).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

MAX_PATHS = 200


def completions(
    text: str, commands: Iterable[str], arguments: Mapping[str, str], personas: Iterable[str]
) -> list[str]:
    """The lines ``text`` (one line starting with ``/``) completes to, sorted; [] when none.
    ``arguments`` says what follows a command: "persona" (a name of ``personas``) or "path"."""
    if not text.startswith("/") or text.startswith("//") or "\n" in text:
        return []
    head, space, arg = text[1:].partition(" ")
    if not space:
        return [f"/{name} " for name in sorted(commands) if name.startswith(head.lower())]
    argument = arguments.get(head.lower())
    if argument == "persona":
        needle = arg.casefold()
        return [
            f"/{head} {p}"
            for p in sorted(personas, key=str.casefold)
            if p.casefold().startswith(needle)
        ]
    if argument == "path":
        return [f"/{head} {path}" for path in path_completions(arg)]
    return []


def path_completions(typed: str) -> list[str]:
    """Paths that start with ``typed`` (``~`` allowed), as typed; folders end with ``/``.
    Hidden entries only when the typed name starts with a dot; at most MAX_PATHS."""
    name = typed.rpartition(os.sep)[2]
    folder_text = typed[: len(typed) - len(name)]
    try:
        entries = sorted(
            Path(os.path.expanduser(folder_text or ".")).iterdir(), key=lambda p: p.name
        )
    except OSError:
        return []
    hidden = name.startswith(".")
    return [
        folder_text + entry.name + (os.sep if entry.is_dir() else "")
        for entry in entries
        if entry.name.startswith(name) and (hidden or not entry.name.startswith("."))
    ][:MAX_PATHS]


def common_prefix(options: list[str]) -> str:
    """The longest text every option starts with."""
    return os.path.commonprefix(options) if options else ""
