"""A chat's system prompt and persona, changed in the app; the persona editor; saved personas."""

from __future__ import annotations

import pytest
from helpers import (
    fake_submits,
    idle,
    offline_app,
    offline_run,
    opened,
    reply_update,
    send,
    tiny_run,
    wait_for,
)
from textual.widgets import Input, TextArea

from chatpage.config.paths import config_dir
from chatpage.config.personas import load_persona_file
from chatpage.store import Store
from chatpage.ui.screens.persona_editor import PersonaEditor
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.system_prompt import SystemPromptEditor

SIZE = (140, 44)
TERSE = (
    "You are terse. Answer in five words or fewer, never more, and never apologise. "
    "Prefer numbers to words. Skip greetings. "
) * 2


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_system_prompt_shared_by_two_chats_is_pinned(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first = app.chat.current
        pinned = app.client.stats().blocks_pinned
        await send(pilot, f"/system {TERSE}")
        assert first.persona.system_prompt == TERSE.strip() and first.persona.name == "alpha"
        assert "not" not in app.notices[-1] and "pinned" not in app.notices[-1]
        await send(pilot, "/new beta")
        second = app.chat.current
        await send(pilot, "/system")  # the editor, with the persona's prompt in it
        await opened(pilot, SystemPromptEditor)
        editor = app.screen.query_one(TextArea)
        assert editor.text == second.persona.system_prompt
        editor.load_text("  ")
        await pilot.press("ctrl+s")
        assert "the system prompt is empty" in str(app.screen.query_one("#system-error").render())
        editor.load_text(TERSE)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: second.persona.system_prompt == TERSE.strip(), "the edit")
        assert "shared with 1 other chat(s), pinned" in app.notices[-1]
        await wait_for(pilot, lambda: app.client.stats().blocks_pinned > pinned, "the new pin")

        await send(pilot, "how many?")
        await wait_for(pilot, lambda: idle(app), "the reply")
        stats = second.entries[-1].stats
        assert stats.prefix_hit_tokens > 0  # the pinned system prompt was not computed again
        assert second.for_model()[0] == {"role": "system", "content": TERSE.strip()}


@pytest.mark.slow  # drives the app over an engine
async def test_switch_persona_and_save_as_persona_with_the_editor(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        submitted = fake_submits(app)
        await app.chat.submit_prompt("hello")
        app.chats.requests.deliver(reply_update("fake-1", "hi", True))
        await wait_for(pilot, lambda: session.entries[-1].status == "done", "the reply")
        assert submitted[0][0]["content"] == session.persona.system_prompt

        titles = {c.title for c in app.get_system_commands(app.screen)}
        assert {
            "Edit this chat's system prompt",
            "Switch this chat's persona",
            "Save this chat as a persona",
            "Switch model",
        } <= titles
        await send(pilot, "/persona nobody")
        assert "no persona named 'nobody'" in app.notices[-1]
        await send(pilot, "/persona")  # the picker
        await opened(pilot, PersonaPicker)
        await pilot.press(*"coder", "enter")
        await wait_for(pilot, lambda: session.persona.name == "coder", "the switch")
        assert session.sampling.temperature == 0.2  # coder's defaults
        await send(pilot, "/temp 0.4")

        await send(pilot, "/saveas")
        await opened(pilot, PersonaEditor)
        form = app.screen
        assert form.query_one("#persona-name", Input).value == "coder-mine"
        assert form.query_one("#persona-temperature", Input).value == "0.4"
        form.query_one("#persona-name", Input).value = ""
        await pilot.press("ctrl+s")
        error = form.query_one("#persona-error")
        assert "'name' must be non-empty text" in str(error.render())
        form.query_one("#persona-name", Input).value = "my coder"
        form.query_one("#persona-top_p", Input).value = "2"
        await pilot.press("ctrl+s")
        assert "'top_p' must be a number > 0 and <= 1, got 2" in str(error.render())
        form.query_one("#persona-top_p", Input).value = ""
        form.query_one("#persona-system_prompt", TextArea).load_text("You are my coder.\nBe brief.")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: session.persona.name == "my coder", "the saved persona")

        path = config_dir() / "personas" / "my-coder.yaml"
        saved = load_persona_file(path)
        assert (saved.system_prompt, saved.temperature, saved.top_p) == (
            "You are my coder.\nBe brief.",
            0.4,
            None,
        )
        assert "my coder" in [p.name for p in app.personas]
        assert f"information: saved the persona 'my coder' to {path}" in app.notices
    with Store.open() as store:
        assert store.get_session(session.store_id).persona == "my coder"

    again = offline_app(tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert again.chat.current.persona.system_prompt == "You are my coder.\nBe brief."


@pytest.mark.slow  # drives the app over an engine
async def test_a_system_prompt_set_with_system_survives_a_restart(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        empty = app.chat.current  # no message yet: /system alone saves the chat
        await send(pilot, f"/system {TERSE}")
        assert empty.store_id is not None
        await send(pilot, "/new coder")
        switched = app.chat.current
        fake_submits(app)
        await app.chat.submit_prompt("hello")
        app.chats.requests.deliver(reply_update("fake-1", "hi", True))
        await wait_for(pilot, lambda: switched.entries[-1].status == "done", "the reply")
        await send(pilot, "/system Speak like a pirate.")
        await send(pilot, "/persona assistant")  # a persona's own prompt again
        assert switched.persona.system_prompt != "Speak like a pirate."
        persona_prompt = switched.persona.system_prompt
    with Store.open() as store:
        assert store.get_session(empty.store_id).system_prompt == TERSE.strip()
        assert store.get_session(switched.store_id).system_prompt is None

    again = offline_app(tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        by_id = {s.store_id: s for s in again.chats.sessions}
        terse = by_id[empty.store_id]
        assert (terse.persona.name, terse.persona.system_prompt) == (
            empty.persona.name,
            TERSE.strip(),
        )
        assert terse.for_model()[0] == {"role": "system", "content": TERSE.strip()}
        assert by_id[switched.store_id].persona.system_prompt == persona_prompt


async def test_switching_persona_says_what_of_the_chat_s_own_it_replaced(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await send(pilot, "/max 300")
        await send(pilot, "/system Answer in French.")
        coder = next(p for p in app.personas if p.name == "coder")
        await send(pilot, "/persona coder")
        assert session.persona.system_prompt == coder.system_prompt
        notice = app.notices[-1]
        assert notice.startswith(
            "information: this chat continues as 'coder'; its own system prompt → the persona's, "
        )
        assert f"max tokens 300 → {session.sampling.max_tokens}" in notice
        await send(pilot, "/persona coder")  # nothing of its own left to replace
        assert app.notices[-1] == "information: this chat continues as 'coder'"
