"""The real `chatpage` command in a pseudo-terminal, driven by the bytes a terminal sends.

Pilot injects key names; a terminal sends bytes (``ESC 1`` for alt+1 in xterm and tmux), and
what Textual makes of those is what a user gets. `Terminal` starts the app in a pty of a fixed
size, reads its screen with pyte (a VT100 emulator), writes keys as xterm writes them
(`xterm_bytes`) and waits for text to show.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pyte

COLUMNS, LINES = 150, 45

_NAMED = {
    "escape": "\x1b",
    "enter": "\r",
    "tab": "\t",
    "backspace": "\x7f",
    "up": "\x1b[A",
    "down": "\x1b[B",
    "right": "\x1b[C",
    "left": "\x1b[D",
    "f1": "\x1bOP",
    "f2": "\x1bOQ",
    "alt+up": "\x1b[1;3A",
    "alt+down": "\x1b[1;3B",
    "ctrl+pageup": "\x1b[5;5~",
    "ctrl+pagedown": "\x1b[6;5~",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
    "slash": "/",
    "space": " ",
}


def xterm_bytes(key: str) -> bytes:
    """What xterm (and tmux, GNOME Terminal) sends for the Textual key name ``key``; KeyError
    for a key such a terminal cannot send (ctrl+tab)."""
    if key in _NAMED:
        return _NAMED[key].encode()
    if key.startswith("ctrl+") and len(key) == 6 and key[5].isalpha():
        return bytes([ord(key[5]) & 0x1F])
    if key.startswith("alt+") and len(key) == 5:
        return b"\x1b" + key[4].encode()
    if len(key) == 1 and key.isprintable():
        return key.encode()
    raise KeyError(key)


class Terminal:
    """``chatpage ARGS`` in a pty with ``env`` (added to this process's)."""

    def __init__(self, args: Sequence[str], env: dict[str, str], cwd: Path) -> None:
        self.screen = pyte.Screen(COLUMNS, LINES)
        self._stream = pyte.ByteStream(self.screen)
        self._lock = threading.Lock()
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self._master = master
        self.process = subprocess.Popen(
            [sys.executable, "-m", "chatpage.cli", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            start_new_session=True,
            env={
                **os.environ,
                "TERM": "xterm-256color",
                "COLUMNS": str(COLUMNS),
                "LINES": str(LINES),
                **env,
            },
        )
        os.close(slave)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._master], [], [], 0.2)
                if not ready:
                    if self.process.poll() is not None:
                        return
                    continue
                data = os.read(self._master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self._stream.feed(data)

    def text(self) -> str:
        """The screen now, line by line."""
        with self._lock:
            return "\n".join(line.rstrip() for line in self.screen.display)

    def write(self, data: bytes, pause: float = 0.15) -> None:
        """Send ``data`` as one write (a burst: one read for the app), then let the app read
        it before anything else is sent (a human's keys come apart)."""
        os.write(self._master, data)
        time.sleep(pause)

    def press(self, *keys: str) -> None:
        """Each key as xterm sends it, one write each."""
        for key in keys:
            self.write(xterm_bytes(key))

    def wait(self, condition: Callable[[str], bool], what: str, timeout: float = 20.0) -> str:
        """Wait until ``condition(screen text)``; the screen at the time out is in the error."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if condition(text):
                return text
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the app exited ({self.process.returncode}) waiting for {what}:\n{text}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; the screen:\n{text}")
            time.sleep(0.05)

    def shows(self, needle: str, what: str = "", timeout: float = 20.0) -> str:
        return self.wait(lambda text: needle in text, what or repr(needle), timeout)

    def hides(self, needle: str, what: str = "", timeout: float = 20.0) -> str:
        return self.wait(lambda text: needle not in text, what or f"no {needle!r}", timeout)

    def close(self) -> int | None:
        """End the app (SIGTERM, then SIGKILL) and return its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        os.close(self._master)
        self._reader.join(2)
        return self.process.returncode
