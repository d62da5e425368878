"""The arguments of slash commands, checked (no UI here): numbers of alternatives, what
``/compare`` varies, files to attach. The commands themselves are the UI's table of actions
(`chatpage.ui.actions`). Every problem is a UserError with one line for the user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from chatpage.chat.entry import Attachment
from chatpage.chat.session import MAX_ALTERNATIVES, MIN_ALTERNATIVES
from chatpage.vocab import UserError

MAX_ATTACHMENT_BYTES = 1 << 20
CHARS_PER_TOKEN = 4  # a rough guess before the engine counts exactly
COMPARE_SETTINGS = {
    "temp": "temperature",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "max": "max_tokens",
    "max_tokens": "max_tokens",
    "seed": "seed",
}
"""The settings ``/compare`` varies, by the names it takes."""


def parse_k(arg: str, what: str) -> int:
    """A number of alternatives (2-6)."""
    allowed = f"a whole number from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}"
    try:
        k = int(arg or "3")
    except ValueError:
        raise UserError(f"{what} must be {allowed}, got {arg!r}") from None
    if not MIN_ALTERNATIVES <= k <= MAX_ALTERNATIVES:
        raise UserError(f"{what} must be {allowed}, got {k}")
    return k


def parse_compare(arg: str) -> tuple[str, list[str]]:
    """``temp=0.2,0.8,1.2`` -> ("temperature", ["0.2", "0.8", "1.2"])."""
    name, sep, values = arg.partition("=")
    setting = COMPARE_SETTINGS.get(name.strip().lower())
    if not sep or setting is None:
        raise UserError(
            "use /compare SETTING=V1,V2,... with SETTING one of temp, top_p, top_k, "
            "max, seed; e.g. /compare temp=0.2,0.8,1.2"
        )
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not MIN_ALTERNATIVES <= len(items) <= MAX_ALTERNATIVES:
        raise UserError(
            f"/compare takes {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} values "
            f"separated by commas, got {len(items)}"
        )
    return setting, items


def read_attachment(arg: str, context_tokens: int | None) -> Attachment:
    """The text file at ``arg``; UserError when it is missing, not a regular file, binary,
    huge or cannot fit. It reads at most `MAX_ATTACHMENT_BYTES` + 1 bytes, and may wait on a
    slow disk: call it off the UI loop.

    ``context_tokens`` (the model's window, None before it loads) rejects files that clearly
    cannot fit, by a rough count; the engine's exact count catches the rest when sending.
    """
    if not arg:
        raise UserError("give a path: /file PATH")
    path = Path(arg.strip().strip("'\"")).expanduser()
    if not path.exists():
        raise UserError(f"{arg}: no such file")
    if path.is_dir():
        raise UserError(f"{arg}: is a folder; give a text file")
    try:
        _require_regular(arg, path.stat().st_mode)  # opening a pipe or a device may block
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as file:
            status = os.fstat(file.fileno())
            _require_regular(arg, status.st_mode)  # swapped for another kind since the stat
            data = (
                b""
                if status.st_size > MAX_ATTACHMENT_BYTES  # it may grow: read one more
                else file.read(MAX_ATTACHMENT_BYTES + 1)
            )
    except OSError as err:
        raise UserError(f"{arg}: cannot read it ({err.strerror})") from None
    size = max(status.st_size, len(data))
    if size > MAX_ATTACHMENT_BYTES:
        raise UserError(
            f"{arg}: {-(-size // 1024)} KiB is too big to attach (the limit is "
            f"{MAX_ATTACHMENT_BYTES // 1024} KiB)"
        )
    if b"\x00" in data:
        raise UserError(f"{arg}: looks like a binary file; only text files can be attached")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{arg}: is not UTF-8 text; only text files can be attached") from None
    if context_tokens:
        estimate = len(text) // CHARS_PER_TOKEN
        if estimate >= context_tokens:
            raise UserError(
                f"{path.name} is about {estimate} tokens but the context window is "
                f"{context_tokens}: it would not fit (about {estimate - context_tokens + 1} "
                "tokens too many)"
            )
    return Attachment(path.name, text)


def _require_regular(arg: str, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = (
            "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a special file"
        )
        raise UserError(f"{arg}: is {kind}, not a regular file; only text files can be attached")
