"""Prompt ergonomics: the draft in $EDITOR (ctrl+e), tab completion of commands, personas, paths."""

from __future__ import annotations

import stat

import pytest
from helpers import offline_app, wait_for
from textual.drivers.headless_driver import HeadlessDriver

from chatpage.ui.completion import completions, path_completions
from chatpage.ui.external_editor import edit_text

SIZE = (140, 44)


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_edit_text_runs_the_editor_on_the_draft(tmp_path):
    appender = script(tmp_path, "appender", "printf ' and more\\n' >> \"$1\"")
    assert edit_text("a draft", [appender]) == "a draft and more"
    failing = script(tmp_path, "failing", "exit 3")
    with pytest.raises(ValueError, match="exited with status 3; the draft is unchanged"):
        edit_text("x", [failing])
    with pytest.raises(ValueError, match="cannot run the editor .*set \\$EDITOR"):
        edit_text("x", [str(tmp_path / "no-such-editor")])
    assert not list(tmp_path.glob("chatpage-draft-*"))


@pytest.mark.slow  # drives the app over an engine
async def test_ctrl_e_edits_the_draft_in_the_editor(tmp_path, monkeypatch):
    monkeypatch.setenv("EDITOR", script(tmp_path, "ed", "printf ' (edited)' >> \"$1\""))
    monkeypatch.delenv("VISUAL", raising=False)
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.press(*"first line", "ctrl+j", *"second")
        await pilot.press("ctrl+e")  # headless: no terminal to hand over
        assert "cannot hand the screen to an editor" in app.notices[-1]
        assert prompt.text == "first line\nsecond"

        # a driver that can step aside (as a real terminal's): the editor runs on the draft
        monkeypatch.setattr(HeadlessDriver, "can_suspend", property(lambda self: True))
        await pilot.press("ctrl+e")
        await wait_for(pilot, lambda: prompt.text.endswith("(edited)"), "the edited draft")
        assert prompt.text == "first line\nsecond (edited)"
        assert prompt.cursor_location == prompt.document.end


def test_completions_of_commands_personas_and_paths(tmp_path, monkeypatch):
    commands = ["temp", "top_p", "top_k", "title", "new", "file", "persona"]
    arguments = {"new": "persona", "persona": "persona", "file": "path", "attach": "path"}
    assert completions("/ti", commands, arguments, []) == ["/title "]
    assert completions("/t", commands, arguments, []) == ["/temp ", "/title ", "/top_k ", "/top_p "]
    assert completions("/new a", commands, arguments, ["beta", "Alpha", "assistant"]) == [
        "/new Alpha",
        "/new assistant",
    ]
    assert completions("/persona B", commands, arguments, ["beta"]) == ["/persona beta"]
    assert completions("hello /t", commands, arguments, []) == []
    assert completions("//t", commands, arguments, []) == []
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".hidden").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert completions("/file no", commands, arguments, []) == ["/file notes/", "/file notes.txt"]
    assert completions("/attach no", commands, arguments, []) == [
        "/attach notes/",
        "/attach notes.txt",
    ]
    assert path_completions("") == ["notes/", "notes.txt"]
    assert path_completions(".h") == [".hidden"]
    assert path_completions(f"{tmp_path}/notes/") == []


@pytest.mark.slow  # drives the app over an engine
async def test_tab_completes_in_the_message_box(tmp_path, monkeypatch):
    (tmp_path / "report.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.press(*"/ti", "tab")
        assert prompt.text == "/title "
        prompt.load_text("/t")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab")  # several: the first, and the options are shown
        assert prompt.text == "/temp "
        info = str(app.chat.query_one("#prompt-info").render())
        assert "tab: /temp · /think · /title · /tools · /top_k · /top_p" in info
        await pilot.press("tab", "tab", "tab", "tab")
        assert prompt.text == "/top_k " and app.focused is prompt
        prompt.load_text("/new cod")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab")
        assert prompt.text == "/new coder"
        prompt.load_text("/file rep")
        prompt.move_cursor(prompt.document.end)
        await pilot.press("tab", "enter")
        assert [a.name for a in app.chat.current.attachments] == ["report.txt"]
        await pilot.press(*"plain", "tab")  # not a command: tab moves the focus on
        assert app.focused is not prompt
