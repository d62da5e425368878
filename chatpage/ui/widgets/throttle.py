"""Throttled: redraw a streaming widget at most ~10 times a second, less when drawing is dear.

Every redraw of a streaming pane costs the app's thread a layout pass and a repaint, and that
thread shares the GIL with the engine's: each millisecond it spends is close to a millisecond the
engine waits. So the pause before the next redraw grows with the CPU time the app's thread spent
since the previous one (the redraw, the screen updates it caused, the stream's events): the
thread stays near UI_SHARE of one core, redrawing no more often than every REDRAW_S and no less
than every MAX_REDRAW_S. A final change (the reply ended) is drawn at once.
"""

from __future__ import annotations

import time

REDRAW_S = 0.1  # the shortest pause between two redraws (<= 10 Hz per pane)
MAX_REDRAW_S = 0.5  # the longest: a long reply still visibly streams
UI_SHARE = 0.05  # of one core: the app thread's CPU time the pause aims at while streaming


def redraw_pause(spent_s: float) -> float:
    """The pause before the next redraw when the app's thread spent ``spent_s`` seconds of CPU
    since the previous one."""
    return min(MAX_REDRAW_S, max(REDRAW_S, spent_s / UI_SHARE))


class Throttled:
    """Mixin for widgets: implement `redraw`, call `request_redraw` on every change."""

    _redraw_pending: bool = False
    _pause_s: float = REDRAW_S
    _cpu_at_redraw: float | None = None  # the app thread's CPU clock at the last timed redraw

    def redraw(self) -> None:
        raise NotImplementedError

    def request_redraw(self, final: bool) -> None:
        if final:
            self.redraw()
        elif not self._redraw_pending:
            self._redraw_pending = True
            self.set_timer(self._pause_s, self._timed_redraw)  # type: ignore[attr-defined]

    def _timed_redraw(self) -> None:
        self._redraw_pending = False
        now = time.thread_time()
        if self._cpu_at_redraw is not None:
            self._pause_s = redraw_pause(now - self._cpu_at_redraw)
        self._cpu_at_redraw = now
        self.redraw()
