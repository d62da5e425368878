"""A model pulled from the Hugging Face Hub inside the TUI (`chatpage.hub`, as `chatpage pull`).

One pull at a time, on a thread of its own (which imports huggingface_hub: not the app's start): the UI and the model in use go on (chats keep
being answered). Its progress shows in the status line; the model picker (/model) offers to
cancel it, which keeps what was fetched for the next pull to resume. Once fetched, the model is
switched to like any other: it loads beside the one in use, which answers until it is ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from textual.app import App

from chatpage.config.settings import format_size
from chatpage.hub.refs import PullCancelled
from chatpage.ui.errors import report
from chatpage.ui.history import Say
from chatpage.ui.widgets.block_gauge import BlockGauge

if TYPE_CHECKING:
    from chatpage.hub.pull import Plan, Progress

SHOW_EVERY_S = 0.25
"""The status line is redrawn at most this often while a pull runs."""


class ModelPulls:
    """The app's pull: `start` one, `cancel` it; ``switch`` gets the model once it is fetched."""

    def __init__(
        self,
        app: App[Any],
        gauge: Callable[[], BlockGauge],
        say: Say,
        switch: Callable[[str], None],
    ) -> None:
        self.app = app
        self.gauge = gauge
        self.say = say
        self.switch = switch
        self.ref: str | None = None
        """What is being pulled (as typed, then as the Hub names it); None when nothing is."""
        self._cancel = threading.Event()
        self._shown = 0.0
        self._base = ""  # the status line before the pull's progress was added to it
        self._line = ""  # the status line as the pull last set it

    def start(self, text: str) -> None:
        """Pull ``text`` (``REPO[:QUANT]``), unless a pull is running already."""
        if self.ref is not None:
            self.say(f"{self.ref} is still being pulled; cancel it in /model first", "warning")
            return
        self.ref = text
        cancel = self._cancel = threading.Event()
        self.say(f"asking the Hub for {text}…", "information")
        self.app.run_worker(lambda: self._run(text, cancel), thread=True, group="pull")

    def cancel(self) -> None:
        """Stop the pull at its next chunk (what it fetched stays, to resume)."""
        self._cancel.set()

    # -- on the pull's thread ------------------------------------------------------------------
    def _run(self, text: str, cancel: threading.Event) -> None:
        from chatpage.hub.cache import run_name  # huggingface_hub: a third of a second
        from chatpage.hub.pull import plan_pull, run_pull

        try:
            plan = plan_pull(text)
            self.app.call_from_thread(self._planned, plan)
            name = run_name(plan.ref.repo, run_pull(plan, self._progress, cancel))
        except Exception as e:  # a HubError's line, or a bug's notice: the app runs on
            self.app.call_from_thread(self._ended, None, e)
            return
        self.app.call_from_thread(self._ended, name, None)

    def _progress(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self._shown >= SHOW_EVERY_S:
            self._shown = now
            self.app.call_from_thread(self._show, p)

    # -- on the UI thread ----------------------------------------------------------------------
    def _planned(self, plan: Plan) -> None:
        self.ref = str(plan.ref)
        fetch = "nothing to fetch" if plan.to_fetch <= 0 else f"{format_size(plan.to_fetch)}"
        self.say(f"pulling {plan.ref}: {fetch}; /model can cancel it", "information")

    def _show(self, p: Progress) -> None:
        gauge = self.gauge()
        if gauge.status != self._line:  # the model's own news came in between
            self._base = gauge.status
        share = p.done / p.total if p.total else 1.0
        self._line = (
            f"{self._base} · pulling {self.ref} {share:.0%} of {format_size(p.total)}"
            if self._base
            else f"pulling {self.ref} {share:.0%} of {format_size(p.total)}"
        )
        gauge.status = self._line

    def _ended(self, name: str | None, error: Exception | None) -> None:
        """The pull is over: ``name`` (what /model takes for it) fetched, or ``error``."""
        gauge = self.gauge()
        if self._line and gauge.status == self._line:
            gauge.status = self._base
        self._line = self._base = ""
        ref, self.ref = self.ref or "", None
        if isinstance(error, PullCancelled):
            self.say(str(error), "warning")
        elif error is not None:
            report(error, f"pulling {ref}", self.say)
        elif name is not None:
            self.say(f"pulled {ref}", "information")
            self.switch(name)
