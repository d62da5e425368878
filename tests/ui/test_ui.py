"""The chat UI over the real engine and the tiny random Llama (Textual Pilot).

Replies are random tokens; the tests check the plumbing: streaming, stop, alternatives, the
prefix cache and the gauge's numbers, all read back from the engine's own stats.
"""

from __future__ import annotations

import pytest
from helpers import freed, hold_model_load, idle, make_app, opened, ready, send, tiny_run, wait_for

from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.ui.app import STATS_INTERVAL_S
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.widgets.alternatives import AlternativesView, AltPane
from chatpage.ui.widgets.block_gauge import BlockGauge, segments
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList

SIZE = (150, 48)


async def answered(pilot, app, question: str = "tell me a long story") -> ChatSession:
    """The current chat once ``question`` is sent in it and its reply is done."""
    session = app.chat.current
    await send(pilot, question)
    await wait_for(pilot, lambda: idle(app), "the reply")
    return session


async def alpha_again(pilot, app) -> ChatSession:
    """A new chat with alpha, answered: its prompt starts with alpha's pinned prefix."""
    await send(pilot, "/new alpha")
    return await answered(pilot, app, "what is in the cache?")


async def beta_streaming(pilot, app) -> tuple[ChatSession, ChatSession]:
    """(the first chat, alpha's; a second chat with beta, its reply streaming)."""
    first = app.chat.current
    await send(pilot, "/new beta")
    second = app.chat.current
    await send(pilot, "/max 50")
    await send(pilot, "/seed 1")
    await send(pilot, "/temp 1")  # sampled: a greedy reply of the random model may end early
    await send(pilot, "hello beta")
    return first, second


@pytest.mark.slow  # drives the app over an engine
async def test_a_message_sent_while_the_model_loads_is_answered_once_it_is_ready(
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


@pytest.mark.slow  # drives the app over an engine
async def test_a_new_chat_takes_the_persona_picked(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first = app.chat.current
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


@pytest.mark.slow  # drives the app over an engine
async def test_a_reply_streams_on_while_another_chat_is_on_show(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first, second = await beta_streaming(pilot, app)
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


@pytest.mark.slow  # drives the app over an engine
async def test_a_new_chat_with_a_persona_starts_from_its_pinned_prefix(
    tiny_llama_dir, personas_dir
):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first = app.chat.current
        third = await alpha_again(pilot, app)
        assert third.persona.name == "alpha" and third is not first
        stats = third.entries[-1].stats
        assert stats.prefix_hit_tokens > 0
        header = str(app.chat.session_view(third).query_one(".session-header").render())
        assert f"{stats.prefix_hit_tokens} of {stats.prompt_tokens} prompt tokens" in header


@pytest.mark.slow  # drives the app over an engine
async def test_the_gauge_shows_the_engines_own_numbers(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        await alpha_again(pilot, app)
        await pilot.pause(STATS_INTERVAL_S + 0.4)  # the gauge's next poll
        gauge = app.chat.query_one(BlockGauge)
        assert gauge.stats == app.client.stats()
        assert gauge.stats.blocks_pinned > 0
        assert sum(gauge.segments.values()) == gauge.stats.num_blocks
        assert gauge.segments == segments(app.client.stats())
        assert f"{gauge.stats.blocks_used}/{gauge.stats.num_blocks} blocks" in gauge.render().plain


@pytest.mark.slow  # drives the app over an engine
async def test_ctrl_w_closes_the_chat_on_show(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        await send(pilot, "/new beta")
        third = await alpha_again(pilot, app)
        await pilot.press("ctrl+w")
        assert third not in app.chats.sessions and len(app.chats.sessions) == 2


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
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


async def stopped_story(pilot, app) -> tuple[ChatSession, Entry]:
    """(the current chat, its reply to a long story stopped by escape after a few tokens)."""
    session = app.chat.current
    await send(pilot, "/max 400")
    await send(pilot, "tell me a long story")
    await wait_for(pilot, lambda: session.entries[-1].stats.tokens >= 3, "some tokens")
    await pilot.press("escape")
    await wait_for(pilot, lambda: not session.streaming, "the stop")
    return session, session.entries[-1]


@pytest.mark.slow  # drives the app over an engine
async def test_escape_stops_the_reply_and_frees_its_blocks(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session, reply = await stopped_story(pilot, app)
        assert reply.status == "stopped" and reply.content
        assert 3 <= reply.stats.tokens < 400
        view = app.chat.session_view(session).query(MessageView).last()
        assert "stopped" in str(view.query_one(".message-speaker").render())
        await wait_for(pilot, lambda: freed(app), "the blocks to be freed")


@pytest.mark.slow  # drives the app over an engine
async def test_ctrl_r_asks_again_as_another_version(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session, reply = await stopped_story(pilot, app)
        await send(pilot, "/max 5")
        await pilot.press("ctrl+r")
        assert session.entries[-1] is not reply
        await wait_for(pilot, lambda: idle(app), "the regenerated reply")
        assert [e.role for e in session.entries] == ["user", "assistant"]
        assert session.entries[-1].status == "done"
        assert session.entries[0].replies.versions == [reply, session.entries[-1]]  # a fork


@pytest.mark.slow  # drives the app over an engine
async def test_alt_c_copies_the_last_reply(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session = await answered(pilot, app)
        await pilot.press("alt+c")  # OSC 52 through App.copy_to_clipboard
        assert app.clipboard == session.entries[-1].content


@pytest.mark.slow  # drives the app over an engine
async def test_alt_e_puts_the_last_message_back_in_the_box(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session = await answered(pilot, app)
        await pilot.press("alt+e")  # sending it will fork there
        prompt = app.chat.query_one(PromptInput)
        assert prompt.text == "tell me a long story" and session.editing is session.entries[0]


@pytest.mark.slow  # drives the app over an engine
async def test_up_and_down_walk_the_earlier_prompts(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        await answered(pilot, app)
        await send(pilot, "/max 5")
        prompt = app.chat.query_one(PromptInput)
        await pilot.press("up")
        assert prompt.text == "/max 5"
        await pilot.press("up")
        assert prompt.text == "tell me a long story"
        await pilot.press("down", "down")
        assert prompt.text == ""


@pytest.mark.slow  # drives the app over an engine
async def test_ctrl_j_adds_a_line_and_enter_sends_both(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session = app.chat.current
        prompt = app.chat.query_one(PromptInput)
        prompt.load_text("line one")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("ctrl+j", *"two", "enter")
        await pilot.pause()
        assert session.entries[0].content == "line one\ntwo"
        await wait_for(pilot, lambda: idle(app), "the reply")


async def three_samples(pilot, app) -> ChatSession:
    """The current chat, set to `/samples 3`, once its three samples of a reply are done, their
    panes on show."""
    session = app.chat.current
    await send(pilot, "give me options")
    view = app.chat.session_view(session)
    await wait_for(pilot, lambda: len(view.query(AltPane)) == 3, "three panes")
    await wait_for(pilot, lambda: not session.streaming, "three samples")
    return session


@pytest.mark.slow  # drives the app over an engine
async def test_samples_show_side_by_side_with_their_logprobs(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session = app.chat.current
        await send(pilot, "/samples 3")
        assert session.alt_mode.kind == "samples" and session.alt_mode.k == 3
        await three_samples(pilot, app)
        assert isinstance(app.focused, AlternativesView)
        assert all(c.stats.tokens > 0 for c in session.generation.candidates)
        await pilot.pause(0.3)
        panes = app.chat.session_view(session).query(AltPane)
        assert "logprob" in str(panes[1].query_one(".alt-title").render())


@pytest.mark.slow  # drives the app over an engine
async def test_a_sample_kept_by_its_number_is_the_reply(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        await send(pilot, "/samples 3")
        session = await three_samples(pilot, app)
        texts = [c.text for c in session.generation.candidates]
        await pilot.press("2")
        await pilot.pause()
        assert session.generation is None
        kept = session.entries[-1]
        assert kept.content == texts[1] and kept.label == "sample 2"
        assert not app.chat.session_view(session).query(AltPane)
        assert freed(app)
        assert isinstance(app.focused, PromptInput)
        assert session.alt_mode.kind == "off"  # one reply only


@pytest.mark.slow  # drives the app over an engine
async def test_beams_asked_again_show_their_scores_and_a_click_keeps_one(
    tiny_llama_dir, personas_dir
):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        session = await answered(pilot, app)
        await pilot.press("ctrl+a", "ctrl+a")  # off -> samples -> beam
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
