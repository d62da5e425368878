"""Editing the draft in the user's own editor ($VISUAL, else $EDITOR, else vi)."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path

from chatpage.vocab import UserError


def editor_command() -> list[str]:
    """The editor to run, as arguments (the file name is appended)."""
    configured = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    return shlex.split(configured)


def edit_text(text: str, command: list[str]) -> str:
    """Run ``command FILE`` on a temporary file holding ``text`` and return the file's text
    afterwards (one trailing newline, which editors add, is dropped). Blocks until the editor
    exits. Raises UserError (one line) when the editor cannot run or fails."""
    fd, name = tempfile.mkstemp(prefix="chatpage-draft-", suffix=".md")
    path = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        try:
            done = subprocess.run([*command, str(path)], check=False)
        except OSError as err:
            raise UserError(
                f"cannot run the editor {shlex.join(command)!r} "
                f"({err.strerror or err}); set $EDITOR to one you have"
            ) from None
        if done.returncode != 0:
            raise UserError(
                f"the editor {shlex.join(command)!r} exited with status "
                f"{done.returncode}; the draft is unchanged"
            )
        edited = path.read_text(encoding="utf-8", errors="replace")
    finally:
        path.unlink(missing_ok=True)
    return edited[:-1] if edited.endswith("\n") else edited
