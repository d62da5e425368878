"""The chat UI over the real engine and the tiny random Llama (Textual Pilot).

Replies are random tokens; the tests check the plumbing: streaming, stop, alternatives, the
prefix cache and the gauge's numbers, all read back from the engine's own stats.
"""

from __future__ import annotations

import pytest
from helpers import freed, hold_model_load, idle, make_app, opened, ready, send, tiny_run, wait_for

from chatpage.ui.app import STATS_INTERVAL_S
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.widgets.alternatives import AlternativesView, AltPane
from chatpage.ui.widgets.block_gauge import BlockGauge, segments
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList

SIZE = (150, 48)


@pytest.mark.slow  # drives the app over an engine
async def test_two_personas_stream_switch_cache_and_gauge(
    tiny_llama_dir, personas_dir, monkeypatch
):
    release = hold_model_load(monkeypatch)
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        first = app.chat.current
        assert first.persona.name == "alpha"
        await send(pilot, "sent before the model is ready")
        assert not app.client.ready and first.streaming  # queued by the client
        assert "…" in app.chat.query_one(BlockGauge).status  # loading progress is shown
        release.set()
        await wait_for(pilot, lambda: first.entries[-1].status == "done", "the early reply")
        assert first.entries[-1].stats.tokens > 0

        # a second session with the other persona, through the picker
        await pilot.press("ctrl+n")
        await opened(pilot, PersonaPicker)
        await pilot.press(*"bet", "enter")
        await wait_for(
            pilot,
            lambda: len(app.chats.sessions) == 2 and app.chat.current is not first,
            "the second session",
        )
        second = app.chat.current
        assert second.persona.name == "beta"
        await ready(pilot, app)

        await send(pilot, "/max 50")
        await send(pilot, "/seed 1")
        await send(pilot, "/temp 1")  # sampled: a greedy reply of the random model may end early
        await send(pilot, "hello beta")
        assert second.streaming
        assert "●" in str(app.chat.query_one(SessionList).get_option(str(second.id)).prompt)
        streaming_at_switch = []
        app.chat.watch(
            app.chat, "current", lambda _s: streaming_at_switch.append(second.streaming), init=False
        )
        await pilot.press("alt+1")  # switch away mid-stream
        assert app.chat.current is first and streaming_at_switch == [True]
        await send(pilot, "hello again alpha")
        await wait_for(pilot, lambda: idle(app), "both replies")
        for session in (first, second):
            reply = session.entries[-1]
            assert reply.role == "assistant" and reply.status == "done"
            assert reply.stats.tokens > 0 and reply.stats.ttft_s is not None

        # a third session with alpha starts from its pinned persona prefix
        await send(pilot, "/new alpha")
        third = app.chat.current
        assert third.persona.name == "alpha" and third is not first
        await send(pilot, "what is in the cache?")
        await wait_for(pilot, lambda: idle(app), "the third reply")
        stats = third.entries[-1].stats
        assert stats.prefix_hit_tokens > 0
        header = str(app.chat.session_view(third).query_one(".session-header").render())
        assert f"{stats.prefix_hit_tokens} of {stats.prompt_tokens} prompt tokens" in header

        # the gauge shows exactly the engine's numbers (after its next poll)
        await pilot.pause(STATS_INTERVAL_S + 0.4)
        gauge = app.chat.query_one(BlockGauge)
        assert gauge.stats == app.client.stats()
        assert gauge.stats.blocks_pinned > 0
        assert sum(gauge.segments.values()) == gauge.stats.num_blocks
        assert gauge.segments == segments(app.client.stats())
        assert f"{gauge.stats.blocks_used}/{gauge.stats.num_blocks} blocks" in gauge.render().plain

        # close the current session
        await pilot.press("ctrl+w")
        assert third not in app.chats.sessions and len(app.chats.sessions) == 2


async def test_a_tiny_temperature_in_one_chat_is_greedy_and_ends_no_other_reply(
    tiny_llama_dir, personas_dir
):
    """`/temp 1e-40` once overflowed the sampler and the step's error ended every chat's reply
    (issue 20, item 1): now it is greedy, and the other chat's reply streams on."""
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first = app.chat.current
        for line in ("/max 200", "/temp 1", "/seed 1", "a long sampled reply"):
            await send(pilot, line)
        await send(pilot, "/new beta")
        second = app.chat.current
        await send(pilot, "/temp 1e-40")
        await send(pilot, "hello beta")
        assert first.streaming and second.streaming
        await wait_for(pilot, lambda: idle(app), "both replies")
        for session in (first, second):
            reply = session.entries[-1]
            assert reply.role == "assistant" and reply.status == "done", reply.error
            assert reply.error is None and reply.stats.tokens > 0
        assert app.client.error is None


@pytest.mark.slow  # drives the app over an engine
async def test_stop_regenerate_edit_and_history(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "/max 400")
        await send(pilot, "tell me a long story")
        await wait_for(pilot, lambda: session.entries[-1].stats.tokens >= 3, "some tokens")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not session.streaming, "the stop")
        reply = session.entries[-1]
        assert reply.status == "stopped" and reply.content
        assert 3 <= reply.stats.tokens < 400
        view = app.chat.session_view(session).query(MessageView).last()
        assert "stopped" in str(view.query_one(".message-speaker").render())
        await wait_for(pilot, lambda: freed(app), "the blocks to be freed")

        await send(pilot, "/max 5")
        await pilot.press("ctrl+r")
        assert session.entries[-1] is not reply
        await wait_for(pilot, lambda: idle(app), "the regenerated reply")
        assert [e.role for e in session.entries] == ["user", "assistant"]
        assert session.entries[-1].status == "done"
        assert session.entries[0].replies.versions == [reply, session.entries[-1]]  # a fork

        # copy the reply (OSC 52 through App.copy_to_clipboard)
        await pilot.press("alt+c")
        assert app.clipboard == session.entries[-1].content

        # edit the last message: it goes back to the input; sending it will fork there
        await pilot.press("alt+e")
        prompt = app.chat.query_one(PromptInput)
        assert prompt.text == "tell me a long story" and session.editing is session.entries[0]
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


@pytest.mark.slow  # drives the app over an engine
async def test_samples_beam_and_keep(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "/samples 3")
        assert session.alt_mode.kind == "samples" and session.alt_mode.k == 3
        await send(pilot, "give me options")
        view = app.chat.session_view(session)
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
        assert not app.chat.session_view(session).query(AltPane)
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
        pane = app.chat.session_view(session).query(AltPane).first()
        assert "score" in str(pane.query_one(".alt-title").render())
        await pilot.click(pane)
        await pilot.pause()
        assert session.entries[-1].label == "beam 1" and session.generation is None
        assert freed(app)


@pytest.mark.slow  # drives the app over an engine
async def test_compare_settings_share_the_prompt(tiny_llama_dir, personas_dir):
    app = make_app(tiny_llama_dir, personas_dir)
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, "compare these")
        await wait_for(pilot, lambda: idle(app), "the first reply")
        await send(pilot, "/max 3")
        await send(pilot, "/compare temp=0,0.5,1.2")
        assert "next reply: compare temp=0,0.5,1.2, side by side (ctrl+r" in app.notices[-1]
        await pilot.press("ctrl+r")  # the last message again, that way
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


async def test_a_file_goes_with_the_next_message(tiny_llama_dir, personas_dir, tmp_path):
    app = make_app(tiny_llama_dir, personas_dir)
    notes = tmp_path / "notes.txt"
    notes.write_text("alpha beta gamma")
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
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
        view = app.chat.session_view(session).query(MessageView).first()
        assert "notes.txt" in str(view.query_one(".message-attachments").render())


async def test_a_file_past_the_context_window_is_the_engines_error(
    tiny_llama_dir, personas_dir, tmp_path
):
    app = make_app(tiny_llama_dir, personas_dir)
    dense = tmp_path / "dense.txt"  # few characters per token: passes the rough estimate
    dense.write_text("".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(1500)))
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        await ready(pilot, app)
        await send(pilot, f"/file {dense}")
        await send(pilot, "and this one")
        await wait_for(pilot, lambda: session.entries[-1].status == "error", "the engine's error")
        error = session.entries[-1].error
        assert "context window is 1024" in error and "shorten it by at least" in error
        assert freed(app)
