"""Throttled: redraw a streaming widget at most every REDRAW_S, and at once when it is final."""

from __future__ import annotations

REDRAW_S = 0.1


class Throttled:
    """Mixin for widgets: implement `redraw`, call `request_redraw` on every change."""

    _redraw_pending: bool = False

    def redraw(self) -> None:
        raise NotImplementedError

    def request_redraw(self, final: bool) -> None:
        if final:
            self.redraw()
        elif not self._redraw_pending:
            self._redraw_pending = True
            self.set_timer(REDRAW_S, self._timed_redraw)  # type: ignore[attr-defined]

    def _timed_redraw(self) -> None:
        self._redraw_pending = False
        self.redraw()
