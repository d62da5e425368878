"""The chat UI over the real engine and the tiny random Llama (Textual Pilot).

Replies are random tokens; the tests check the plumbing: streaming, stop, alternatives, the
prefix cache and the gauge's numbers, all read back from the engine's own stats.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from chatpage.config.settings import Settings
from chatpage.engine.config import EngineConfig
from chatpage.ui.app import ChatApp
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.widgets.alternatives import AlternativesView, AltPane
from chatpage.ui.widgets.block_gauge import BlockGauge, segments
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList

SIZE = (150, 48)
PROMPT_BODY = ("Answer in plain words. Keep every answer short and to the point. Never invent "
               "facts. When unsure, say so. Use lists for steps and code blocks for code. ")


def write_persona(directory: Path, name: str, max_tokens: int = 6) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(
        f"name: {name}\ndescription: The {name} test persona\ngreeting: Hi from {name}\n"
        f"temperature: 0\nmax_tokens: {max_tokens}\n"
        f"system_prompt: You are {name}. {PROMPT_BODY * 2}\n"
    )


def alpha_and_beta(tmp_path: Path) -> Path:
    """A personas folder with the "alpha" and "beta" test personas."""
    directory = tmp_path / "personas"
    write_persona(directory, "alpha")
    write_persona(directory, "beta")
    return directory


@pytest.fixture
def personas_dir(tmp_path) -> Path:
    return alpha_and_beta(tmp_path)


def make_app(model_dir: Path, personas_dir: Path | None, **settings) -> ChatApp:
    return ChatApp(model=str(model_dir), config=EngineConfig(kv_cache_bytes=4 << 20),
                   settings=Settings(default_persona="alpha", **settings),
                   personas_dirs=None if personas_dir is None else [personas_dir])


async def wait_for(pilot, condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def idle(app: ChatApp) -> bool:
    stats = app.client.stats()
    return (stats is not None and stats.num_running == 0 and stats.num_waiting == 0
            and not any(s.streaming for s in app.chats.sessions))


async def ready(pilot, app: ChatApp) -> None:
    await wait_for(pilot, lambda: app.client.ready and idle(app)
                   and app.client.stats().blocks_pinned > 0, "the engine and pinned personas")


async def send(pilot, text: str) -> None:
    """What enter does with ``text`` in the prompt (typing is tested where the engine is idle:
    Pilot's key presses wait for the process to go idle, up to 2 s a key while it streams)."""
    await pilot.app.submit_prompt(text)


def freed(app: ChatApp) -> bool:
    """Nothing runs and only the personas' pinned blocks are held."""
    stats = app.client.stats()
    return stats.num_running == 0 and stats.blocks_used == stats.blocks_pinned


def hold_model_load(monkeypatch) -> threading.Event:
    """Make the engine thread wait before loading the model until the event is set."""
    from chatpage.engine import client

    release = threading.Event()
    load = client.LLMEngine.from_pretrained

    def held(*args, **kwargs):
        release.wait(30)
        return load(*args, **kwargs)

    monkeypatch.setattr(client.LLMEngine, "from_pretrained", held)
    return release


async def test_two_personas_stream_switch_cache_and_gauge(tiny_llama_dir, personas_dir,
                                                          monkeypatch):
    release = hold_model_load(monkeypatch)
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        first = app.current
        assert first.persona.name == "alpha"
        await send(pilot, "sent before the model is ready")
        assert not app.client.ready and first.streaming  # queued by the client
        assert "…" in app.query_one(BlockGauge).status  # loading progress is shown
        release.set()
        await wait_for(pilot, lambda: first.entries[-1].status == "done", "the early reply")
        assert first.entries[-1].stats.tokens > 0

        # a second session with the other persona, through the picker
        await pilot.press("ctrl+n")
        assert isinstance(app.screen, PersonaPicker)
        await pilot.press(*"bet", "enter")
        await wait_for(pilot, lambda: len(app.chats.sessions) == 2 and app.current is not first,
                       "the second session")
        second = app.current
        assert second.persona.name == "beta"
        await ready(pilot, app)

        await send(pilot, "/max 50")
        await send(pilot, "/seed 1")
        await send(pilot, "/temp 1")  # sampled: a greedy reply of the random model may end early
        await send(pilot, "hello beta")
        assert second.streaming
        assert "●" in str(app.query_one(SessionList).get_option(str(second.id)).prompt)
        streaming_at_switch = []
        switch_to = app.switch_to
        app.switch_to = lambda s: (streaming_at_switch.append(second.streaming), switch_to(s))
        await pilot.press("alt+1")  # switch away mid-stream
        assert app.current is first and streaming_at_switch == [True]
        await send(pilot, "hello again alpha")
        await wait_for(pilot, lambda: idle(app), "both replies")
        for session in (first, second):
            reply = session.entries[-1]
            assert reply.role == "assistant" and reply.status == "done"
            assert reply.stats.tokens > 0 and reply.stats.ttft_s is not None

        # a third session with alpha starts from its pinned persona prefix
        await send(pilot, "/new alpha")
        third = app.current
        assert third.persona.name == "alpha" and third is not first
        await send(pilot, "what is in the cache?")
        await wait_for(pilot, lambda: idle(app), "the third reply")
        stats = third.entries[-1].stats
        assert stats.prefix_hit_tokens > 0
        header = str(app.session_view(third).query_one(".session-header").render())
        assert f"{stats.prefix_hit_tokens} of {stats.prompt_tokens} prompt tokens" in header

        # the gauge shows exactly the engine's numbers
        await pilot.pause(0.7)
        gauge = app.query_one(BlockGauge)
        assert gauge.stats == app.client.stats()
        assert gauge.stats.blocks_pinned > 0
        assert sum(gauge.segments.values()) == gauge.stats.num_blocks
        assert gauge.segments == segments(app.client.stats())
        assert f"{gauge.stats.blocks_used}/{gauge.stats.num_blocks} blocks" in gauge.render().plain

        # close the current session
        await pilot.press("ctrl+w")
        assert third not in app.chats.sessions and len(app.chats.sessions) == 2


async def test_stop_regenerate_edit_and_history(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.current
        await ready(pilot, app)
        await send(pilot, "/max 400")
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: session.entries[-1].stats.tokens >= 3, "some tokens")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not session.streaming, "the stop")
        reply = session.entries[-1]
        assert reply.status == "stopped" and reply.content
        assert 3 <= reply.stats.tokens < 400
        view = app.session_view(session).query(MessageView).last()
        assert "stopped" in str(view.query_one(".message-speaker").render())
        await wait_for(pilot, lambda: freed(app), "the blocks to be freed")

        await send(pilot, "/max 5")
        await pilot.press("ctrl+r")
        assert session.entries[-1] is not reply
        await wait_for(pilot, lambda: idle(app), "the regenerated reply")
        assert [e.role for e in session.entries] == ["user", "assistant"]
        assert session.entries[-1].status == "done"

        # copy the reply (OSC 52 through App.copy_to_clipboard)
        await pilot.press("alt+c")
        assert app.clipboard == session.entries[-1].content

        # edit the last message: it goes back to the input, the exchange is dropped
        await pilot.press("alt+e")
        prompt = app.query_one(PromptInput)
        assert prompt.text == "tell me a long story" and session.entries == []
        prompt.load_text("")
        await pilot.press("up")  # earlier prompts come back
        assert prompt.text == "/max 5"
        await pilot.press("up")
        assert prompt.text == "tell me a long story"
        await pilot.press("down", "down")
        assert prompt.text == ""

        # ctrl+j adds a newline, enter sends both lines as one message
        prompt.load_text("line one")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("ctrl+j", *"two", "enter")
        await pilot.pause()
        assert session.entries[0].content == "line one\ntwo"
        await wait_for(pilot, lambda: idle(app), "the reply")


async def test_samples_beam_and_keep(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.current
        await ready(pilot, app)
        await send(pilot, "/samples 3")
        assert session.alt_mode.kind == "samples" and session.alt_mode.k == 3
        await send(pilot, "give me options")
        view = app.session_view(session)
        await wait_for(pilot, lambda: len(view.query(AltPane)) == 3, "three panes")
        panes = view.query(AltPane)
        assert isinstance(app.focused, AlternativesView)
        await wait_for(pilot, lambda: not session.streaming, "three samples")
        texts = [c.text for c in session.generation.candidates]
        assert all(c.stats.tokens > 0 for c in session.generation.candidates)
        await pilot.pause(0.3)
        assert "logprob" in str(panes[1].query_one(".alt-title").render())
        await pilot.press("2")
        await pilot.pause()
        assert session.generation is None
        kept = session.entries[-1]
        assert kept.content == texts[1] and kept.label == "sample 2"
        assert not app.session_view(session).query(AltPane)
        assert freed(app)
        assert isinstance(app.focused, PromptInput)
        assert session.alt_mode.kind == "off"  # one reply only

        # beam search over the same question, via ctrl+a (off -> samples -> beam) and ctrl+r
        await pilot.press("ctrl+a", "ctrl+a")
        assert session.alt_mode.kind == "beam"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: session.choosing and not session.streaming, "the beams")
        assert all(c.score is not None for c in session.generation.candidates)
        await pilot.pause(0.3)
        pane = app.session_view(session).query(AltPane).first()
        assert "score" in str(pane.query_one(".alt-title").render())
        await pilot.click(pane)
        await pilot.pause()
        assert session.entries[-1].label == "beam 1" and session.generation is None
        assert freed(app)


async def test_compare_settings_share_the_prompt(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.current
        await ready(pilot, app)
        await send(pilot, "compare these")
        await wait_for(pilot, lambda: idle(app), "the first reply")
        await send(pilot, "/max 3")
        await send(pilot, "/compare temp=0,0.5,1.2")
        labels = [c.label for c in session.generation.candidates]
        assert labels == ["temp=0.0", "temp=0.5", "temp=1.2"]
        await wait_for(pilot, lambda: not session.streaming, "the comparison")
        session_texts = [c.text for c in session.generation.candidates]
        # every request found the prompt's blocks in the prefix cache
        assert all(c.stats.prefix_hit_tokens > 0 for c in session.generation.candidates)
        await send(pilot, "/keep 3")
        assert session.entries[-1].label == "temp=1.2"
        assert session.entries[-1].content == session_texts[2]
        assert [e.role for e in session.entries] == ["user", "assistant"]
        assert freed(app)

        await send(pilot, "/beam 9")
        assert "beam must be a whole number from 2 to 6, got 9" in app.notices[-1]
        await send(pilot, "/temp -1")
        assert "temperature must be a number >= 0" in app.notices[-1]
        await send(pilot, "/top_p 0.5")
        assert session.sampling.top_p == 0.5


async def test_file_attachment_and_too_long_prompt(tiny_llama_dir, personas_dir, tmp_path):
    app = make_app(tiny_llama_dir, personas_dir)
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha beta gamma")
    dense = tmp_path / "dense.txt"  # few characters per token: passes the rough estimate
    dense.write_text("".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1500)))
    async with app.run_test(size=SIZE) as pilot:
        session = app.current
        await ready(pilot, app)
        await send(pilot, f"/file {tmp_path / 'missing.txt'}")
        assert "no such file" in app.notices[-1]
        await send(pilot, f"/file {notes}")
        assert [a.name for a in session.attachments] == ["notes.txt"]
        await send(pilot, "summarize")
        assert session.attachments == []
        user = session.entries[0]
        assert "alpha beta gamma" in user.model_content()
        await wait_for(pilot, lambda: idle(app), "the reply")
        view = app.session_view(session).query(MessageView).first()
        assert "notes.txt" in str(view.query_one(".message-attachments").render())

        await send(pilot, f"/file {dense}")
        await send(pilot, "and this one")
        await wait_for(pilot, lambda: session.entries[-1].status == "error", "the engine's error")
        error = session.entries[-1].error
        assert "context window is 1024" in error and "shorten it by at least" in error
        assert freed(app)
