"""Thinking in the TUI, over the real engine and a tiny random model whose chat template thinks
(its generation prompt opens ``<think>``) and has Qwen3's ``enable_thinking`` switch: a reply's
thinking folds under "thought for N tokens" and opens on alt+t, is saved with the message and
comes back after a restart, is never sent back to the model, and /think off turns it off (kept
with the chat); each alternative's thinking folds in its pane; a model whose template has no
switch says so."""

from __future__ import annotations

import shutil

import pytest
from helpers import FakeClient, make_app, ready, send, tiny_run, wait_for, write_persona
from textual.widgets import Static

from chatpage.chat.chats import Chats
from chatpage.config.personas import Persona
from chatpage.ui.text import clean
from chatpage.ui.widgets.alternatives import AltPane
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.thought import ThoughtFold

SIZE = (120, 40)
SWITCHED = (  # ChatML; earlier replies keep only their answer; replies think unless switched off
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ message['content'].split('</think>')[-1] }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)


def _thinking_model(tiny_llama_dir, root):
    model = root / "thinker"
    shutil.copytree(tiny_llama_dir, model)
    (model / "chat_template.jinja").write_text(SWITCHED)
    return model


def _thinking_setup(tiny_llama_dir, root):
    """The thinking model and a persona folder with alpha (10 tokens a reply)."""
    personas = root / "personas"
    write_persona(personas, "alpha", max_tokens=10)
    return _thinking_model(tiny_llama_dir, root), personas


def _fold(app) -> ThoughtFold:
    views = list(app.chat.session_view(app.chat.current).transcript.query(MessageView))
    fold = views[-1].thought
    assert fold is not None
    return fold


async def _reply(pilot, app, text: str):
    session = app.chat.current
    before = len(session.entries)
    await send(pilot, text)
    await wait_for(
        pilot,
        lambda: len(session.entries) == before + 2 and session.entries[-1].status == "done",
        "the reply",
    )
    await pilot.pause()
    return session.entries[-1]


@pytest.mark.slow  # drives the app over an engine
async def test_thinking_folds_opens_survives_a_restart_and_is_not_sent_back(
    tiny_llama_dir, tmp_path
):
    model, personas = _thinking_setup(tiny_llama_dir, tmp_path)
    async with tiny_run(model, personas, SIZE) as (app, pilot):
        reply = await _reply(pilot, app, "Think about it.")
        assert reply.reasoning and 0 < reply.reasoning_tokens <= reply.stats.tokens
        fold = _fold(app)
        line = fold.query_one(".thought-line", Static)
        body = fold.query_one(".thought-body", Static)
        assert fold.display and not body.display
        assert str(line.content) == f"▸ thought for {reply.reasoning_tokens} tokens"
        await pilot.press("alt+t")
        assert body.display and str(body.content) == clean(reply.reasoning.strip())
        assert str(line.content).startswith("▾ thought for")
        await pilot.press("alt+t")
        assert not body.display

        session = app.chat.current
        sent = session.for_model()  # what the next turn sends: the answer, not the thinking
        assert [m["content"] for m in sent if m["role"] == "assistant"] == [reply.content]
        thought, tokens = reply.reasoning, reply.reasoning_tokens

        await send(pilot, "/think off")
        assert session.thinking is False and "thinking off" in app.notices[-1]
        plain = await _reply(pilot, app, "Now answer at once.")
        assert plain.reasoning == "" and plain.content
        assert not _fold(app).display

    again = make_app(model, personas)  # the same data dir: the chat comes back from SQLite
    async with again.run_test(size=SIZE) as pilot:
        await ready(pilot, again)
        restored = again.chat.current.entries[1]
        assert (restored.reasoning, restored.reasoning_tokens) == (thought, tokens)
        assert again.chat.current.thinking is False  # /think off is the chat's, and kept
        views = list(again.chat.session_view(again.chat.current).transcript.query(MessageView))
        assert views[1].thought is not None and views[1].thought.display


async def test_think_says_when_the_template_has_no_switch(tiny_llama_dir, tmp_path):
    personas = tmp_path / "personas"
    write_persona(personas, "alpha")
    async with tiny_run(tiny_llama_dir, personas, SIZE) as (app, pilot):
        await send(pilot, "/think on")
        assert "has no thinking switch in its chat template" in app.notices[-1]
        assert app.chat.current.thinking is None
        await send(pilot, "/think maybe")
        assert "/think takes on or off" in app.notices[-1]


def test_a_think_choice_is_dropped_with_a_notice_for_a_model_without_the_switch():
    notices: list[str] = []
    client = FakeClient()
    chats = Chats(client, lambda _u: None, notify=notices.append)
    session = chats.open(Persona("p", "a test persona", "Be brief."))
    session.thinking = False  # set while a model with the switch was loaded
    chats.send(session, "hello")
    assert session.thinking is None and "no thinking switch" in notices[-1]
    assert len(client.submitted) == 1  # the reply was still asked for


@pytest.mark.slow  # drives the app over an engine
async def test_each_alternative_shows_its_thinking_folded_and_the_kept_one_keeps_it(
    tiny_llama_dir, tmp_path
):
    model, personas = _thinking_setup(tiny_llama_dir, tmp_path)
    async with tiny_run(model, personas, SIZE) as (app, pilot):
        session = app.chat.current
        await send(pilot, "/samples 2")
        await send(pilot, "Think of two answers.")
        view = app.chat.session_view(session)
        await wait_for(pilot, lambda: session.choosing and not session.streaming, "two samples")
        await pilot.pause(0.3)
        panes = list(view.query(AltPane))
        cands = session.generation.candidates
        assert len(panes) == 2 and all(c.reasoning and c.reasoning_tokens > 0 for c in cands)
        for pane, cand in zip(panes, cands, strict=True):
            line = pane.thought.query_one(".thought-line", Static)
            assert pane.thought.display
            assert str(line.content) == f"▸ thought for {cand.reasoning_tokens} tokens"
        await pilot.click(panes[0].thought.query_one(".thought-line"))  # opens it, keeps none
        body = panes[0].thought.query_one(".thought-body", Static)
        assert body.display and str(body.content) == clean(cands[0].reasoning.strip())
        assert session.choosing
        thought = cands[1].reasoning
        await pilot.press("2")
        await pilot.pause()
        assert session.generation is None and session.entries[-1].reasoning == thought
