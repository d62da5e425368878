"""The UI shows chatpage's own user-facing errors (`UserError`) as advice, and anything else as a
bug: a short internal-error notice naming the log, the traceback in the log, the app still
running (Pilot, offline app)."""

from __future__ import annotations

from dataclasses import replace

from helpers import fake_submits, offline_run, wait_for

from chatpage.config.errorlog import log_path
from chatpage.ui.actions.action import Action, Controls
from chatpage.ui.actions.table import BY_ID, BY_SLASH

SIZE = (120, 40)


def _broken(action: Action, error: Exception) -> Action:
    """``action`` with a handler that has a bug: it raises ``error``."""

    async def run(controls: Controls, arg: str | None) -> None:
        raise error

    return replace(action, run=run)


def _logged() -> str:
    path = log_path()
    return path.read_text(encoding="utf-8") if path.exists() else ""


async def test_a_user_error_shows_its_message_and_is_not_logged(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        before = _logged()  # (the load failure is logged)
        await app.chat.submit_prompt("/temp hot")
        assert app.notices[-1] == "error: temperature must be a number >= 0 (0 = greedy), got 'hot'"
        await app.chat.submit_prompt("/keep x")
        assert app.notices[-1] == "error: use /keep N with N the pane's number, got 'x'"
        assert app.chat.prompt.text == "/keep x"  # back in the box, to be fixed
        assert _logged() == before


async def test_a_bug_in_a_handler_is_an_internal_error_with_its_traceback_logged(
    tmp_path, monkeypatch
):
    # a ValueError from a bug is not advice: before, "bad index" was shown as if the user erred
    monkeypatch.setitem(BY_SLASH, "title", _broken(BY_SLASH["title"], ValueError("bad index")))
    monkeypatch.setitem(
        BY_ID, "sampling_settings", _broken(BY_ID["sampling_settings"], RuntimeError("lost state"))
    )
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await app.chat.submit_prompt("/title my chat")
        assert app.notices[-1] == (
            f"error: internal error while running /title (ValueError); "
            f"the traceback is in {log_path()}"
        )
        logged = _logged()
        assert "running /title: bad index" in logged
        assert "Traceback (most recent call last)" in logged and "in run" in logged
        assert "ValueError: bad index" in logged
        app.chat.prompt.clear()
        app.chat.prompt.focus()
        await pilot.press("f2")  # the same through a key
        await wait_for(pilot, lambda: "RuntimeError" in app.notices[-1], "the key's notice")
        assert app.notices[-1].startswith(
            "error: internal error while running sampling_settings (RuntimeError)"
        )
        assert "RuntimeError: lost state" in _logged()
        # the app keeps running: a user error is still advice, a message is still sent
        await app.chat.submit_prompt("/temp hot")
        assert app.notices[-1].startswith("error: temperature must be")
        submitted = fake_submits(app)
        await app.chat.submit_prompt("hello")
        assert submitted and submitted[-1][-1] == {"role": "user", "content": "hello"}
        assert app.is_running


async def test_a_bug_while_sending_keeps_the_draft(tmp_path, monkeypatch):
    async with offline_run(tmp_path, SIZE) as (app, pilot):

        def send(session, text):
            raise KeyError("no such entry")

        monkeypatch.setattr(app.chats, "send", send)
        app.chat.prompt.load_text("my long draft")
        await app.chat.submit_prompt("my long draft")
        assert app.notices[-1].startswith(
            "error: internal error while sending a message (KeyError)"
        )
        assert app.chat.prompt.text == "my long draft"
        assert "KeyError: 'no such entry'" in _logged()
