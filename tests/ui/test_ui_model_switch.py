"""Switching the model in the app: chats stay, prompts pinned again, the gauge follows."""

from __future__ import annotations

import threading

import pytest
from helpers import idle, opened, ready, send, wait_for

from chatpage.config.settings import Settings
from chatpage.engine.client import EngineConfig
from chatpage.ui.app import ChatApp
from chatpage.ui.screens.model_picker import ModelPicker, model_problem
from chatpage.ui.widgets.block_gauge import BlockGauge

SIZE = (140, 44)


def engine_threads() -> int:
    return sum(t.name == "chatpage-engine" for t in threading.enumerate())


def test_model_problem_names_what_is_wrong(tmp_path, tiny_llama_dir):
    assert model_problem(str(tiny_llama_dir)) is None
    assert model_problem(str(tmp_path / "nope")) == f"{tmp_path / 'nope'}: no such file or folder"
    assert "no config.json in it" in model_problem(str(tmp_path))
    (tmp_path / "notes.txt").write_text("x")
    assert "not a .gguf file or a model folder" in model_problem(str(tmp_path / "notes.txt"))


@pytest.mark.slow
async def test_switch_model_keeps_the_chats_and_pins_again(
    tiny_llama_dir, default_model_dir, personas_dir
):
    app = ChatApp(
        model=str(tiny_llama_dir),
        config=EngineConfig(kv_cache_bytes=48 << 20),
        settings=Settings(default_persona="alpha"),
        personas_dirs=[personas_dir],
    )
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        session = app.chat.current
        old_client = app.client
        old_blocks = app.client.stats().num_blocks
        await send(pilot, "/max 400")
        await send(pilot, "/temp 1")
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: session.entries[-1].stats.tokens >= 2, "some tokens")

        await send(pilot, "/model /no/such/model")
        await wait_for(pilot, lambda: "/no/such" in app.notices[-1], "the refusal")
        assert app.notices[-1] == "error: /no/such/model: no such file or folder"
        assert app.client is old_client and session.streaming
        await send(pilot, f"/model {default_model_dir}")
        await wait_for(pilot, lambda: app.client is not old_client, "the new client")
        assert session.entries[-1].status == "stopped"  # the reply in progress stopped
        assert app.chats.requests.client is app.client and app.client.model == str(
            default_model_dir
        )
        await wait_for(pilot, lambda: app.client.ready, "the new model", timeout=120)
        await ready(pilot, app)  # the personas' prompts are pinned on the new model
        gauge = app.chat.query_one(BlockGauge)
        await wait_for(pilot, lambda: gauge.stats == app.client.stats(), "the gauge")
        assert gauge.stats.num_blocks != old_blocks and gauge.stats.blocks_pinned > 0
        assert app.client.model_name in gauge.status
        await wait_for(pilot, lambda: engine_threads() == 1, "the old engine to close")

        await send(pilot, "/max 3")
        await send(pilot, "and now?")  # the same chat goes on, on the new model
        await wait_for(pilot, lambda: idle(app), "the reply")
        reply = session.entries[-1]
        assert reply.status == "done", reply.error
        assert reply.stats.prefix_hit_tokens > 0
        assert [e.role for e in session.entries] == ["user", "assistant"] * 2

        # back to the tiny model, through the picker (the typed folder is offered)
        await send(pilot, "/model")
        await opened(pilot, ModelPicker)
        await pilot.press(*str(tiny_llama_dir))
        await pilot.pause(0.2)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.client.model == str(tiny_llama_dir), "the switch")
        await ready(pilot, app)
        await wait_for(pilot, lambda: gauge.stats == app.client.stats(), "the gauge")
        assert gauge.stats.num_blocks == old_blocks
