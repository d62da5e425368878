"""What the screen looks like, cell by cell: SVG snapshots (pytest-textual-snapshot) of the chat
screen, the alternatives panes and the block gauge, kept in __snapshots__/test_snapshots/.

A change to the layout, the styles or a text fails them on purpose: look at the report it writes
(snapshot_report.html), then accept the new screens with ``pytest tests/ui/test_snapshots.py
--snapshot-update`` and commit the SVGs. Deterministic by construction: a fixed terminal size,
no model (the app over a fixed path that does not exist; replies fed by hand with fixed stats), a
fixed theme and no clock on screen.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import (
    engine_stats,
    fake_submits,
    offline_app,
    reply_update,
    samples_on_show,
    wait_for,
)
from textual.pilot import Pilot

from chatpage.ui.app import ChatApp
from chatpage.ui.widgets.block_gauge import BlockGauge

SIZE = (110, 34)
NOWHERE = Path("/nonexistent")  # the load error names the model's path: the same on every run
REPLY = (
    "A page table maps **virtual** pages to frames:\n\n"
    "- one entry per page\n- a miss walks the table\n\n"
    "```python\nframe = table[page]\n```\n"
)


def app() -> ChatApp:
    return offline_app(NOWHERE, theme="chatpage")


async def failed(pilot: Pilot) -> ChatApp:
    """The app at rest after its load failure (the status line says why, with the fixed path),
    without what the clock decides: the cursor is steady and the toasts are gone."""
    chat_app = pilot.app
    assert isinstance(chat_app, ChatApp)
    chat_app.chat.prompt.cursor_blink = False
    gauge = chat_app.chat.query_one(BlockGauge)
    await wait_for(pilot, lambda: "model path not found" in gauge.status, "the load failure")
    chat_app.clear_notifications()
    return chat_app


async def _one_reply(pilot: Pilot) -> None:
    chat_app = await failed(pilot)
    fake_submits(chat_app)
    await chat_app.chat.submit_prompt("What is a page table?")
    chat_app.chats.requests.deliver(reply_update("fake-1", REPLY, True))
    session = chat_app.chat.current
    await wait_for(pilot, lambda: not session.streaming, "the reply")


async def _two_samples(pilot: Pilot) -> None:
    chat_app = await failed(pilot)
    await samples_on_show(pilot, chat_app, "Name a color.", ["Teal, **calm**.", "Red."])
    chat_app.clear_notifications()  # "next reply: 2 samples" (a toast: gone after a while)


async def _busy_gauge(pilot: Pilot) -> None:
    chat_app = await failed(pilot)
    gauge = chat_app.chat.query_one(BlockGauge)
    gauge.status = "ready · tiny-model"
    gauge.stats = engine_stats()


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_the_chat_screen_with_a_question_and_its_reply(snap_compare) -> None:
    assert snap_compare(app(), terminal_size=SIZE, run_before=_one_reply)


def test_the_alternatives_panes_side_by_side(snap_compare) -> None:
    assert snap_compare(app(), terminal_size=SIZE, run_before=_two_samples)


def test_the_block_gauge_with_every_segment_in_use(snap_compare) -> None:
    assert snap_compare(app(), terminal_size=SIZE, run_before=_busy_gauge)


def test_the_chat_screen_after_a_failed_load(snap_compare) -> None:
    """The first screen a user sees when the model is missing: the error in the status line."""
    assert snap_compare(app(), terminal_size=SIZE, run_before=failed)
