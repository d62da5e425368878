"""The error log: the full traceback of every error that chatpage shows as one line.

The UI and the engine thread tell the user what went wrong in one line; the whole story goes to
``chatpage.log`` under the data dir, so a bug report can carry it. Errors are rare, so each is
appended with its own open (several chatpage processes may share the file); past ``MAX_BYTES``
the log is rotated once (``chatpage.log.1``).
"""

from __future__ import annotations

import datetime
import os
import threading
import traceback
from pathlib import Path

from chatpage.config.paths import data_dir

LOG_NAME = "chatpage.log"
MAX_BYTES = 1 << 20

_lock = threading.Lock()


def log_path() -> Path:
    """Where the error log is: ``$XDG_DATA_HOME/chatpage/chatpage.log``."""
    return data_dir() / LOG_NAME


def one_line(error: BaseException) -> str:
    """The first line of ``error``'s message, or its type's name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def log_error(error: BaseException, where: str) -> str:
    """Append ``error``'s traceback to the log under ``where`` (what was being done); return
    its one-line form. Never raises: a log that cannot be written loses the entry, not the app."""
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    trace = "".join(traceback.format_exception(error))
    entry = f"{stamp} pid {os.getpid()} {where}: {one_line(error)}\n{trace}\n"
    path = log_path()
    with _lock:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists() and path.stat().st_size > MAX_BYTES:
                path.replace(path.with_name(LOG_NAME + ".1"))
            with path.open("a", encoding="utf-8") as f:
                f.write(entry)
        except OSError:
            pass
    return one_line(error)
