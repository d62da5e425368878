"""Speculative decoding in the app, as a user meets it (Pilot over the real engine and the tiny
random Llama, int4: the weights whose kernels compute every row alike, so the engine drafts):
a greedy regenerate drafts from the reply it replaces and repeats it, every draft kept, the
stats line says how many drafts were kept,
the text is the one the same chat gets with speculation off, and ``/spec off`` drafts nothing."""

from __future__ import annotations

import pytest
from helpers import alpha_and_beta, idle, ready, send, wait_for

from chatpage.config.settings import Settings
from chatpage.engine.client import EngineConfig
from chatpage.ui.app import ChatApp
from chatpage.ui.widgets.message import MessageView

SIZE = (150, 48)


def foot(app: ChatApp) -> str:
    """The stats line of the last message on show."""
    return str(app.chat.session_view(app.chat.current).query(MessageView).last()._foot())


@pytest.mark.slow  # drives the app over an engine
async def test_a_regenerate_drafts_from_the_reply_it_replaces(tiny_llama_dir, tmp_path):
    app = ChatApp(
        model=str(tiny_llama_dir),
        config=EngineConfig(kv_cache_bytes=4 << 20, weight_dtype="int4"),
        settings=Settings(default_persona="alpha"),
        personas_dirs=[alpha_and_beta(tmp_path)],
    )
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "/max 40")  # (the persona's temperature is 0: greedy)
        await send(pilot, "tell me about paging")
        await wait_for(pilot, lambda: idle(app), "the first reply")
        first = session.entries[-1]

        await pilot.press("ctrl+r")  # the same question again: the old reply is the draft
        await wait_for(pilot, lambda: idle(app) and session.entries[-1] is not first, "again")
        drafted = session.entries[-1]
        stats = drafted.stats
        assert drafted.status == "done" and stats.tokens == 40
        assert 0 < stats.accepted_tokens <= stats.draft_tokens
        # the same reply: its prompt's tail computed as the first time (in a chunk of its
        # own), so every draft is kept
        assert drafted.content == first.content and stats.accepted_tokens == stats.draft_tokens
        shown = f"drafts {stats.accepted_tokens}/{stats.draft_tokens} accepted"
        await wait_for(pilot, lambda: shown in foot(app), "the stats line")

        await send(pilot, "/spec off")
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: idle(app) and session.entries[-1] is not drafted, "off")
        plain = session.entries[-1]
        assert plain.status == "done" and plain.stats.draft_tokens == 0
        assert plain.content == drafted.content  # (both over the cached prompt: alike)
        await wait_for(pilot, lambda: "tok" in foot(app), "the plain stats line")
        assert "drafts" not in foot(app)
        assert session.entries[0].replies.versions == [first, drafted, plain]
