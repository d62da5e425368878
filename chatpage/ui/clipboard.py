"""Copying text: the system clipboard where there is one, else the terminal's (OSC 52).

OSC 52 asks the terminal to set its clipboard; some terminals and multiplexers drop it silently
(tmux without ``set-clipboard on``, macOS Terminal), so a system clipboard is used first when
this machine has one: pyperclip if it is installed, else the platform's own tool (wl-copy on
Wayland, xclip or xsel on X11, pbcopy on macOS). Over SSH there is usually no display: OSC 52.
`copy_text` does both and says which reached the text.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable

from textual.dom import DOMNode

TOOL_TIMEOUT_S = 3.0
OSC52_NOTE = (
    "the terminal's clipboard (OSC 52: tmux needs set-clipboard on, some terminals drop it)"
)

_TOOLS: tuple[tuple[str, tuple[str, ...], str | None], ...] = (
    # (tool, arguments, environment variable that must be set, or None for macOS)
    ("wl-copy", (), "WAYLAND_DISPLAY"),
    ("xclip", ("-selection", "clipboard"), "DISPLAY"),
    ("xsel", ("--clipboard", "--input"), "DISPLAY"),
    ("pbcopy", (), None),
)


def system_tool() -> list[str] | None:
    """The command that writes stdin to the system clipboard here, or None when there is none."""
    for tool, args, needs in _TOOLS:
        usable = os.environ.get(needs) if needs else sys.platform == "darwin"
        path = shutil.which(tool) if usable else None
        if path:
            return [path, *args]
    return None


def has_system_clipboard() -> bool:
    """Whether a system clipboard may be reachable (pyperclip, or a platform tool)."""
    return importlib.util.find_spec("pyperclip") is not None or system_tool() is not None


def copy_to_system(text: str) -> str | None:
    """Put ``text`` on the system clipboard; returns what did it ("xclip", "pyperclip"), or
    None when there is no system clipboard or it failed (the caller falls back to OSC 52).
    Blocks for up to TOOL_TIMEOUT_S: call it off the UI thread."""
    try:
        import pyperclip  # optional: used when the user has it installed
    except ImportError:
        pass
    else:
        try:
            pyperclip.copy(text)
            return "pyperclip"
        except pyperclip.PyperclipException:
            pass
    command = system_tool()
    if command is None:
        return None
    try:
        subprocess.run(
            command,
            input=text.encode(),
            check=True,
            timeout=TOOL_TIMEOUT_S,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.basename(command[0])


def copy_text(node: DOMNode, text: str, what: str, say: Callable[[str], None]) -> None:
    """Copy ``text``: the app's own clipboard and OSC 52 at once; the system clipboard too
    where there is one (in a thread worker of ``node``). ``say`` gets the notice that says
    which reached ``text`` (``what`` names it: "reply", "code block")."""
    app = node.app
    app.copy_to_clipboard(text)

    def copied(system: str | None) -> None:
        where = f"the system clipboard ({system})" if system else OSC52_NOTE
        say(f"copied the {what} ({len(text):,} characters) to {where}")

    if not has_system_clipboard():
        copied(None)
        return

    def to_system() -> None:
        how = copy_to_system(text)
        app.call_from_thread(copied, how)

    node.run_worker(to_system, thread=True, group="clipboard")
