"""A long saved chat in the real app (Textual Pilot) over the real store: it opens with only
its latest messages mounted, scrolling up (or moving the focus up past the first) mounts the
earlier ones in order, and switching chats does not mount it again. Before, every message was
mounted when the chat opened (5,000 took minutes)."""

from __future__ import annotations

import pytest
from helpers import offline_app, wait_for

from chatpage.store import Store
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.transcript import BATCH, TranscriptView

SIZE = (120, 40)
LONG = 3000


def long_chat(store: Store, title: str, count: int) -> int:
    """A saved chat of ``count`` messages, one chain (user and assistant in turn)."""
    chat = store.create_session(title, "assistant")
    parent = None
    for n in range(count):
        role = ("user", "assistant")[n % 2]
        parent = store.add_message(chat, role, f"message {n} of **{title}**", parent_id=parent)
    return chat


def shown(transcript: TranscriptView) -> list[int]:
    """The indices (in the chat) of the messages mounted, top first."""
    index = {id(e): i for i, e in enumerate(transcript.session.entries)}
    return [index[id(v.entry)] for v in transcript.query(MessageView)]


def laid_out(transcript: TranscriptView) -> bool:
    """The messages mounted are laid out, and the view placed among them (it follows the end
    once they overflow it)."""
    return transcript.max_scroll_y > 0 and transcript.is_anchored and not transcript.placing


@pytest.mark.slow  # drives the app over an engine
async def test_a_long_chat_mounts_its_latest_messages_then_earlier_ones_going_up(tmp_path):
    with Store.open() as store:
        long_chat(store, "short", 4)
        long_id = long_chat(store, "long", LONG)  # the most recent: shown first
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.chat.current is not None, "the chats", 60)
        session = app.chat.current
        assert session.store_id == long_id and len(session.entries) == LONG
        transcript = app.chat.session_view(session).transcript
        await wait_for(pilot, lambda: LONG - 1 in shown(transcript), "the last message", 60)
        await wait_for(pilot, lambda: laid_out(transcript), "the messages laid out")
        mounted = shown(transcript)
        assert len(mounted) <= 4 * BATCH and mounted == list(range(LONG - len(mounted), LONG))
        earlier = str(transcript.query_one(".earlier").render())
        assert f"▲ {LONG - len(mounted):,} earlier messages" in earlier

        # scrolling to the top mounts the messages before, in order; those shown stay
        for _ in range(3):
            count = len(shown(transcript))
            transcript.scroll_home(animate=False, immediate=True)
            await wait_for(pilot, lambda n=count: len(shown(transcript)) > n, "earlier ones")
            await wait_for(pilot, lambda: laid_out(transcript), "them laid out")
            now = shown(transcript)
            assert now == list(range(LONG - len(now), LONG)) and len(now) < LONG
            assert transcript.scroll_y > 0  # the messages that were on show stay in view

        # the focus moved up past the first mounted message: the one before it
        first, top = transcript.query(MessageView).first(), shown(transcript)[0]
        first.focus()
        await pilot.press("k")
        await wait_for(pilot, lambda: app.focused is not first, "the focus to move")
        assert isinstance(app.focused, MessageView)
        assert app.focused.entry is session.entries[top - 1]

        # switching away and back keeps what is mounted (nothing is mounted again)
        count = len(shown(transcript))
        views = list(transcript.query(MessageView))
        app.chat.step(1)
        await wait_for(pilot, lambda: app.chat.current is not session, "the other chat")
        app.chat.step(-1)
        await wait_for(pilot, lambda: app.chat.current is session, "the long chat again")
        assert list(transcript.query(MessageView)) == views and len(views) == count
