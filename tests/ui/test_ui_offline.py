"""The chat UI without a model: markup safety, persona notices, load failures, screens, keymap.

The engine is pointed at a model path that does not exist (it fails at once), and where a reply is
needed the client's submit is replaced so the test can feed RequestUpdates through the same handler
the engine thread uses (`chats.requests.deliver`, the app's inbox).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import (
    engine_stats,
    fake_submits,
    hold_model_load,
    offline_app,
    offline_run,
    opened,
    palette_offers,
    reply_update,
    wait_for,
)
from textual.widgets import Input
from textual.widgets.markdown import MarkdownBlock, MarkdownFence

from chatpage.config.paths import config_dir
from chatpage.engine.client import EngineStatus, StatusKind
from chatpage.ui.messages import ClientStatus
from chatpage.ui.screens.help import HelpScreen
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.sampling_settings import SamplingSettingsScreen
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList

SIZE = (140, 44)
USER_TEXT = "[bold]x[/bold] [/ \x1b[31m red \x07 bell [@click=app.quit]q[/] lone ["
MODEL_TEXT = (
    "**ok** [red]no[/red] [/ \x1b[2J cleared? \x07 <b>html</b> [link](x)\n\n"
    "```python\nprint('[bold]')\n```\n"
)


def submit(app, text: str) -> None:
    """Enter in the message box with ``text`` (the message it posts)."""
    prompt = app.chat.query_one(PromptInput)
    prompt.post_message(PromptInput.Submitted(text))


@pytest.mark.slow  # drives the app over an engine
async def test_markup_and_control_characters_render_literally(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        submitted = fake_submits(app)
        session = app.chat.current
        submit(app, USER_TEXT)
        await wait_for(pilot, lambda: submitted, "the submit")
        assert submitted[0][-1] == {"role": "user", "content": USER_TEXT}  # sent verbatim

        half = MODEL_TEXT[:40]
        app.chats.requests.deliver(reply_update("fake-1", half, False))
        app.chats.requests.deliver(reply_update("fake-1", MODEL_TEXT[40:], True))
        await wait_for(pilot, lambda: session.entries[-1].status == "done", "the reply")

        user_view, reply_view = app.chat.session_view(session).query(MessageView)
        shown = str(user_view.query_one(".message-body").render())
        assert shown == "[bold]x[/bold] [/ ␛[31m red ␇ bell [@click=app.quit]q[/] lone ["

        def blocks() -> list[str]:
            return [
                b.code if isinstance(b, MarkdownFence) else str(b.render())
                for b in reply_view.query(MarkdownBlock)
            ]

        # the Markdown is drawn after the reply is done (a loaded machine takes a while)
        await wait_for(
            pilot, lambda: any("print('[bold]')" in b for b in blocks()), "the whole reply drawn"
        )
        blocks = blocks()
        paragraph = next(p for p in blocks if "[red]no[/red]" in p)
        assert "[/ ␛[2J cleared? ␇ <b>html</b>" in paragraph
        assert "\x1b" not in "".join(blocks)
        assert any("print('[bold]')" in b for b in blocks)
        assert "14 tokens" in str(reply_view.query_one(".message-foot").render())  # 7 per update
        assert session.title.startswith("[bold]x[/bold]")

        # click a code block to copy it; click "copy" to copy the whole message
        fence = reply_view.query_one(MarkdownFence)
        await wait_for(pilot, lambda: fence.region.height > 0, "the code block laid out")
        await pilot.pause()
        await pilot.click(fence)
        assert app.clipboard == "print('[bold]')"
        await pilot.click(reply_view.query_one(".message-copy"))
        assert app.clipboard == MODEL_TEXT
        await pilot.press("alt+k")
        assert app.clipboard == "print('[bold]')"
        sidebar = str(app.chat.query_one(SessionList).get_option(str(session.id)).prompt)
        assert "[bold]x[/bold]" in sidebar

        # the command palette (markup-only API) shows the title without choking on it
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert any(t.startswith("Switch to chat 1: \\[bold]x\\[/bold]") for t in titles)
        await palette_offers(pilot, "switch")
        await pilot.press("escape")

        # notices never parse markup either
        await pilot.press("escape")
        submit(app, "/new [bold]nobody[/")
        await wait_for(pilot, lambda: "nobody" in app.notices[-1], "the notice")
        assert "no persona named '[bold]nobody[/'" in app.notices[-1]


async def test_load_failure_is_shown_and_messages_get_an_error(tmp_path, monkeypatch):
    release = hold_model_load(monkeypatch)
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        session = app.chat.current
        submit(app, "hello?")
        await wait_for(pilot, lambda: session.streaming, "the queued message")
        release.set()
        await wait_for(pilot, lambda: not session.streaming, "the error")
        reply = session.entries[-1]
        assert reply.status == "error" and "model path not found" in reply.error
        assert "model path not found" in app.chat.query_one(BlockGauge).status
        assert any(n.startswith("error:") and "model path not found" in n for n in app.notices)
        submit(app, "and now?")
        await wait_for(pilot, lambda: "did not load" in app.notices[-1], "the refusal")
        assert len(session.entries) == 2  # nothing was queued into the dead engine


async def test_broken_persona_file_gives_a_notice_and_the_rest_load(tmp_path):
    user_dir = config_dir() / "personas"
    user_dir.mkdir(parents=True)
    (user_dir / "broken.yaml").write_text("name: [unclosed\n")
    (user_dir / "mine.yaml").write_text(
        "name: mine\ndescription: My own persona\nsystem_prompt: You are mine.\n"
    )
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        names = {p.name for p in app.personas}
        assert {"mine", "coder", "assistant"} <= names
        notice = next(n for n in app.notices if "broken.yaml" in n)
        assert notice.startswith("warning: persona file skipped:") and "invalid YAML" in notice
        assert app.chat.current.persona.name == "assistant"


KEYMAP = {"new_session": "f5", "bogus_id": "f6"}


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_a_keymap_and_a_theme_from_the_settings_apply(tmp_path):
    app = offline_app(tmp_path, bindings=KEYMAP, theme="nord")
    async with app.run_test(size=SIZE) as pilot:
        assert app.theme == "nord"
        assert any("unknown id bogus_id" in n for n in app.notices)
        await pilot.press("f5")
        await opened(pilot, PersonaPicker)
        await pilot.press(*"cod", "enter")
        await wait_for(pilot, lambda: app.chat.current.persona.name == "coder", "the coder chat")
        assert app.chat.current.sampling.temperature == 0.2  # the persona's default


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_the_help_screen_lists_a_rebound_key(tmp_path):
    app = offline_app(tmp_path, bindings=KEYMAP)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f1")
        await opened(pilot, HelpScreen)
        assert ("f5", "new_session", "New chat") in app.screen.keys


async def test_the_sampling_screen_refuses_a_bad_value_and_enter_saves(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await pilot.press("f2")
        await opened(pilot, SamplingSettingsScreen)
        temperature = app.screen.query_one("#set-temperature", Input)
        temperature.value = "hot"
        await pilot.click("#settings-save")
        error = str(app.screen.query_one("#settings-error").render())
        assert error == "temperature must be a number >= 0 (0 = greedy), got 'hot'"
        temperature.value = "0.3"
        seed = app.screen.query_one("#set-seed", Input)
        seed.value = "7"
        seed.focus()
        await pilot.press("enter")  # enter in any field saves too
        await pilot.pause()
        assert not isinstance(app.screen, SamplingSettingsScreen), str(
            app.screen.query_one("#settings-error").render()
        )
        assert (session.sampling.temperature, session.sampling.seed) == (0.3, 7)
        header = str(app.chat.session_view(session).query_one(".session-header").render())
        assert "temp 0.3" in header and "seed 7" in header


async def test_shift_enter_and_ctrl_j_start_a_new_line(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        prompt = app.chat.query_one(PromptInput)
        prompt.focus()
        prompt.load_text("a")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("shift+enter", "b", "ctrl+j", "c")
        assert prompt.text == "a\nb\nc"


async def test_the_palette_offers_the_chat_commands(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, _pilot):
        commands = {c.title for c in app.get_system_commands(app.screen)}
        assert {
            "New chat",
            "Stop",
            "Regenerate",
            "Alternatives",
            "Sampling",
            "New chat: coder",
        } <= commands


async def test_the_gauge_flashes_when_the_engine_preempts(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, _pilot):
        gauge = app.chat.query_one(BlockGauge)
        base = engine_stats()
        gauge.stats = base
        gauge.stats = replace(base, preemptions_recompute=1)
        assert gauge.has_class("-preempted")


async def test_default_theme_is_chatpage_and_unknown_theme_warns(tmp_path):
    app = offline_app(tmp_path, theme="no-such-theme")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert app.theme == "chatpage"
        assert any("theme 'no-such-theme' does not exist" in n for n in app.notices)


async def test_an_engine_warning_while_stepping_is_a_notice_and_not_the_status(tmp_path):
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        gauge = app.chat.query_one(BlockGauge)
        await wait_for(pilot, lambda: "model path not found" in gauge.status, "the load error")
        warning = EngineStatus(StatusKind.WARNING, "CUDA graphs are off ([red]x[/])")
        app.post_message(ClientStatus(warning, app.client))
        await wait_for(pilot, lambda: "CUDA graphs are off" in app.notices[-1], "the notice")
        assert app.notices[-1] == "warning: CUDA graphs are off ([red]x[/])"
        assert "model path not found" in gauge.status  # the status line keeps what it said
