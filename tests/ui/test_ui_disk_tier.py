"""The app over an engine with a KV disk tier, quit and started again (Textual Pilot, the tiny
random Llama): the personas are pinned from disk, a chat's earlier prompt is read back instead of
computed, and the reply's stats line and the gauge say so."""

from __future__ import annotations

import pytest
from helpers import idle, ready, send, wait_for

from chatpage.config.settings import Settings
from chatpage.engine.config import EngineConfig
from chatpage.ui.app import STATS_INTERVAL_S, ChatApp
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.message import MessageView, stats_line

SIZE = (150, 48)
QUESTION = " ".join(["tell me about paged attention and its blocks"] * 8)  # several blocks


def _app(model_dir, personas_dir) -> ChatApp:
    return ChatApp(
        model=str(model_dir),
        config=EngineConfig(kv_cache_bytes=4 << 20, kv_disk_bytes=64 << 20),
        settings=Settings(default_persona="alpha"),
        personas_dirs=[personas_dir],
    )


@pytest.mark.slow  # drives the app over an engine, twice
async def test_a_restarted_app_reads_the_prompt_back_from_disk(tiny_llama_dir, personas_dir):
    app = _app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, QUESTION)
        await wait_for(pilot, lambda: idle(app), "the reply")
        assert app.chat.current.entries[-1].stats.disk_tokens == 0
    again = _app(tiny_llama_dir, personas_dir)
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot, again)
        stats = again.client.stats()
        assert stats.disk_hit_tokens >= 16 * stats.blocks_pinned  # pinned from disk, no prefill
        await send(pilot, QUESTION)
        await wait_for(pilot, lambda: idle(again), "the reply")
        reply = again.chat.current.entries[-1]
        assert reply.stats.disk_tokens >= 3 * 16  # the question's blocks, read back
        view = again.chat.session_view(again.chat.current).query(MessageView).last()
        await wait_for(pilot, lambda: "from disk" in str(view._foot()), "the stats line")
        assert f"{reply.stats.disk_tokens} from disk" in stats_line(reply.stats)
        await pilot.pause(STATS_INTERVAL_S + 0.4)  # the gauge's next poll
        gauge = str(again.chat.query_one(BlockGauge).render())
        assert "│ disk " in gauge and f"hits {again.client.stats().disk_hit_tokens} tokens" in gauge
