"""What the UI does with an exception from something the user did. A `UserError` is advice: its
one line is shown. Anything else is a bug: its traceback goes to the error log, and the notice
says so and where the log is. Either way the app keeps running."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from chatpage.config.errorlog import log_error, log_path
from chatpage.ui.history import Say
from chatpage.vocab import UserError

BUG_NOTICE_S = 20.0
"""How long the internal-error notice stays (long enough to read the log's path)."""


def report(error: Exception, where: str, say: Say) -> None:
    """Tell the user about ``error``, raised while ``where`` (e.g. "running /temp")."""
    if isinstance(error, UserError):
        say(str(error), "error")
        return
    log_error(error, where)
    say(
        f"internal error while {where} ({type(error).__name__}); the traceback is in {log_path()}",
        "error",
        timeout=BUG_NOTICE_S,
    )


async def guarded(run: Callable[[], Awaitable[None] | None], where: str, say: Say) -> None:
    """Run ``run`` (awaiting what it returns, if anything); what it raises is reported, not
    raised."""
    try:
        done = run()
        if done is not None:
            await done
    except Exception as err:
        report(err, where, say)
