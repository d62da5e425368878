"""The pause between two redraws of a streaming pane follows the app thread's CPU time."""

from __future__ import annotations

import pytest

from chatpage.ui.widgets.throttle import MAX_REDRAW_S, REDRAW_S, UI_SHARE, redraw_pause


def test_the_pause_keeps_the_app_thread_near_its_share_within_the_bounds():
    assert redraw_pause(0.0) == REDRAW_S  # cheap redraws: at most 10 a second
    assert redraw_pause(UI_SHARE * 0.25) == pytest.approx(0.25)  # spent / pause == UI_SHARE
    assert redraw_pause(10.0) == MAX_REDRAW_S  # however dear, a streaming reply still moves
