"""Branches, /continue and the context meter in the app (Pilot over the real engine and the tiny
random Llama): ◀ 2/2 ▶ at a fork moves between versions, a long chat drops (greys) its oldest
turns instead of failing, and the header shows used / context tokens."""

from __future__ import annotations

import pytest
from helpers import alpha_and_beta, idle, make_app, ready, send, wait_for

from chatpage.chat.entry import ReplyStats
from chatpage.config.settings import Settings
from chatpage.engine.client import EngineConfig
from chatpage.ui.app import ChatApp
from chatpage.ui.widgets.message import MessageView, stats_line

SIZE = (150, 48)


def views(app: ChatApp) -> list[MessageView]:
    return list(app.chat.session_view(app.chat.current).query(MessageView))


def versions_label(view: MessageView) -> str:
    return str(view.query_one(".message-versions").render())


@pytest.mark.slow  # drives the app over an engine
async def test_regenerate_forks_and_the_arrows_switch_versions(tiny_llama_dir, tmp_path):
    app = make_app(tiny_llama_dir, alpha_and_beta(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "/temp 1")
        await send(pilot, "/seed 1")
        await send(pilot, "first question")
        await wait_for(pilot, lambda: idle(app), "the first reply")
        first = session.entries[-1]
        await send(pilot, "/seed 2")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: idle(app), "the second version")
        second = session.entries[-1]
        assert second is not first and len(views(app)) == 2
        await wait_for(pilot, lambda: versions_label(views(app)[-1]) == "◀ 2/2 ▶", "the arrows")

        await pilot.click(views(app)[-1].query_one(".message-versions"), offset=(0, 0))  # ◀
        await wait_for(pilot, lambda: session.entries[-1] is first, "the first version")
        await wait_for(pilot, lambda: views(app)[-1].entry is first, "its view")
        assert versions_label(views(app)[-1]) == "◀ 1/2 ▶" and len(views(app)) == 2

        views(app)[-1].focus()  # keys on a focused message: ] shows the next version
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: session.entries[-1] is second, "the next version")

        # editing the question forks above both replies; the old branch stays reachable
        await pilot.press("escape")
        app.chat.prompt.focus()
        await pilot.press("alt+e")
        app.chat.prompt.load_text("first question, rephrased")
        await pilot.press("enter")
        await wait_for(
            pilot,
            lambda: idle(app) and session.entries[0].place().count == 2,
            "the edited question's reply",
        )
        assert [e.content for e in session.entries][0] == "first question, rephrased"
        assert versions_label(views(app)[0]) == "◀ 2/2 ▶"


async def test_continue_extends_the_reply_in_place(tiny_llama_dir, tmp_path):
    app = make_app(tiny_llama_dir, alpha_and_beta(tmp_path))
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "/max 3")
        await send(pilot, "a story please")
        await wait_for(pilot, lambda: idle(app), "the short reply")
        reply = session.entries[-1]
        before, tokens = reply.content, reply.stats.tokens
        await send(pilot, "/continue")
        await wait_for(pilot, lambda: idle(app) and reply.stats.tokens > tokens, "more of it")
        assert session.entries[-1] is reply and reply.content.startswith(before)
        assert len(reply.content) > len(before) and len(views(app)) == 2
        assert reply.stats.prefix_hit_tokens > 0  # its prompt came from the cache


@pytest.mark.slow  # drives the app over an engine
async def test_a_long_chat_drops_its_oldest_turns_and_the_meter_shows_it(tiny_llama_dir, tmp_path):
    app = ChatApp(
        model=str(tiny_llama_dir),
        config=EngineConfig(kv_cache_bytes=4 << 20, max_model_len=320),
        settings=Settings(default_persona="alpha"),
        personas_dirs=[alpha_and_beta(tmp_path)],
    )
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        assert session.context_tokens == 320
        header = app.chat.session_view(session).header
        await send(pilot, "/max 8")
        for n in range(4):
            await send(pilot, f"question {n}: " + "tell me about paging " * 14)
            await wait_for(pilot, lambda: idle(app), f"reply {n}")
            assert session.entries[-1].status == "done"  # never refused
        dropped = [e for e in session.entries if e.dropped]
        assert dropped and dropped[0] is session.entries[0] and len(session.entries) == 8
        await wait_for(pilot, lambda: views(app)[0].has_class("-dropped"), "the grey")
        assert not views(app)[-1].has_class("-dropped")
        assert any("left out of what the model sees" in n for n in app.notices)
        used = session.used_tokens
        assert 0 < used <= 320
        shown = str(header.render())
        assert f"context {used} / 320 tokens" in shown and "left out (greyed)" in shown


def test_the_stats_line_says_how_many_drafts_were_accepted():
    stats = ReplyStats(tokens=24, prompt_tokens=40, prefix_hit_tokens=16)
    assert "drafts" not in stats_line(stats)  # (nothing drafted: not a word of it)
    stats.draft_tokens, stats.accepted_tokens = 20, 12
    assert stats_line(stats).endswith(" · cache 16/40 prompt tokens · drafts 12/20 accepted")
