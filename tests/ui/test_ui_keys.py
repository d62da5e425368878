"""The message box keeps its own keys, drafts stay with their chat, copying says where it went.

Offline app (no model): replies are fed as RequestUpdates through the app's own handler.
"""

from __future__ import annotations

import os
import stat

import pytest
from helpers import (
    fake_submits,
    offline_app,
    offline_run,
    opened,
    reply_update,
    samples_on_show,
    stopped,
    wait_for,
)
from textual import events
from textual.widgets.markdown import MarkdownFence

from chatpage.chat.session import ChatSession
from chatpage.engine.client import RequestUpdate, Usage
from chatpage.store import Store
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.clipboard import system_tool
from chatpage.ui.screens.code_picker import CodeBlockPicker
from chatpage.ui.screens.confirm import Confirm
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.session_list import SessionList

SIZE = (140, 44)
REPLY = "Here:\n\n```python\nprint('one two three four')\n```\n"


async def reply(pilot, app, text: str = REPLY) -> None:
    """Send a message in the current chat and finish its reply with ``text``."""
    submitted = fake_submits(app)
    session = app.chat.current
    await app.chat.submit_prompt("a question")
    app.chats.requests.deliver(reply_update(f"fake-{len(submitted)}", text, True))
    await wait_for(pilot, lambda: session.entries[-1].status == "done", "the reply")


async def drag(pilot, widget, start: tuple[int, int], end: tuple[int, int]) -> None:
    """Press the mouse at ``start`` in ``widget``, move to ``end``, release: as a terminal
    reports it, through the app's own event handling (which makes the Click that follows)."""
    app = pilot.app
    for kind, (dx, dy) in (
        (events.MouseDown, start),
        (events.MouseMove, end),
        (events.MouseUp, end),
    ):
        x, y = widget.region.x + dx, widget.region.y + dy
        app.post_message(kind(None, x, y, 0, 0, 1, False, False, False, screen_x=x, screen_y=y))
        await pilot.pause()


@pytest.fixture
def no_display(monkeypatch) -> None:
    """No X or Wayland display: a copy goes to the terminal (OSC 52), read from app.clipboard."""
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)


async def other_version_done(pilot, session: ChatSession, text: str) -> None:
    """Wait until the chat's last reply is the version ``text``, done."""
    await wait_for(
        pilot,
        lambda: session.entries[-1].content == text and session.entries[-1].status == "done",
        "the other version",
    )


async def type_text(pilot, app, text: str) -> None:
    app.chat.prompt.focus()
    await pilot.press(*text)


@pytest.mark.slow  # drives the app over an engine
async def test_editing_keys_win_while_the_box_has_text(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        first = app.chat.current
        await app.chat.submit_prompt("/new")
        await opened(pilot, PersonaPicker)
        await pilot.press("enter")  # the default persona
        await wait_for(pilot, lambda: len(app.chats.sessions) == 2, "a second chat")
        prompt = app.chat.prompt
        await type_text(pilot, app, "hello big world")
        await pilot.press("ctrl+w")  # deletes a word, does not close the chat
        assert prompt.text == "hello big " and len(app.chats.sessions) == 2
        await pilot.press("ctrl+a")  # line start, not the alternatives
        assert prompt.cursor_location == (0, 0)
        assert app.chat.current.alt_mode.kind == "off"
        await pilot.press("end", "ctrl+w", "ctrl+w")
        assert prompt.text == ""
        await pilot.press("ctrl+a")  # the box is empty: the chat's key again
        assert app.chat.current.alt_mode.kind == "samples"
        await pilot.press("ctrl+w")
        assert app.chats.sessions == [first]


@pytest.mark.slow  # drives the app over an engine
async def two_chats(pilot, app) -> tuple[ChatSession, ChatSession]:
    """(the first chat, a second with coder): each answered, the second on show."""
    await reply(pilot, app)
    first = app.chat.current
    await app.chat.submit_prompt("/new coder")
    second = app.chat.current
    await reply(pilot, app)
    return first, second


async def two_drafts(pilot, app) -> tuple[ChatSession, ChatSession]:
    """`two_chats` with a draft typed in each: "first draft" in the first, on show."""
    first, second = await two_chats(pilot, app)
    await type_text(pilot, app, "second draft")
    await pilot.press("alt+1")
    await type_text(pilot, app, "first draft")
    return first, second


async def quit_with_drafts(tmp_path) -> ChatSession:
    """The first of `two_drafts`, once the app has quit with the second chat on show."""
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        first, _ = await two_drafts(pilot, app)
        await pilot.press("alt+2")
    return first


@pytest.mark.slow  # drives the app over an engine
async def test_each_chat_keeps_its_own_draft(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        first, _ = await two_chats(pilot, app)
        await type_text(pilot, app, "second draft")
        await pilot.press("alt+1")
        assert app.chat.current is first and app.chat.prompt.text == ""
        await type_text(pilot, app, "first draft")
        await pilot.press("alt+2")
        assert app.chat.prompt.text == "second draft"
        await pilot.press("alt+1")
        assert app.chat.prompt.text == "first draft"


@pytest.mark.slow  # drives the app over an engine
async def test_a_chat_closed_from_the_sidebar_keeps_its_draft(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        first, second = await two_drafts(pilot, app)
        app.chat.query_one(SessionList).focus()  # the box has text, so ctrl+w edits there
        await pilot.press("ctrl+w")
        assert app.chats.sessions == [second] and app.chat.prompt.text == "second draft"
        assert app.chat.open_saved(first.store_id).draft == "first draft"
        assert app.chat.prompt.text == "first draft"


@pytest.mark.slow  # drives the app over an engine
async def test_drafts_are_saved_when_the_app_quits(tmp_path):
    first = await quit_with_drafts(tmp_path)
    with Store.open() as store:
        assert store.draft(first.store_id) == "first draft"


@pytest.mark.slow  # drives the app over an engine
async def test_drafts_come_back_in_their_chats_after_a_restart(tmp_path):
    first = await quit_with_drafts(tmp_path)
    again = offline_app(tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        by_title = {s.store_id: s for s in again.chats.sessions}
        assert by_title[first.store_id].draft == "first draft"
        assert again.chat.prompt.text == by_title[again.chat.current.store_id].draft


async def test_code_block_click_copies_but_a_drag_selection_does_not(tmp_path, no_display):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await reply(pilot, app)
        view = app.chat.session_view(app.chat.current).query(MessageView).last()
        await wait_for(pilot, lambda: view.query(MarkdownFence), "the code block")
        fence = view.query_one(MarkdownFence)
        await wait_for(pilot, lambda: fence.region.height > 0, "the code block laid out")
        await pilot.pause()

        # drag across part of the code: a selection, and nothing copied
        await drag(pilot, fence, (4, 1), (14, 1))
        selected = app.screen.get_selected_text()
        assert selected and selected in "print('one two three four')"
        assert app.clipboard == "" and not any("copied" in n for n in app.notices)

        # a plain click copies the block (no system clipboard here: OSC 52, and it says so)
        await drag(pilot, fence, (4, 1), (4, 1))
        assert app.clipboard == "print('one two three four')"
        assert "to the terminal's clipboard (OSC 52" in app.notices[-1]


async def test_copy_uses_the_system_clipboard_where_there_is_one(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pasted = tmp_path / "pasted"
    tool = bin_dir / "xclip"  # stands in for the X11 tool: it keeps what it is given
    tool.write_text(f"#!/bin/sh\ncat > '{pasted}'\n")
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    assert system_tool() == [str(tool), "-selection", "clipboard"]
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await reply(pilot, app)
        await pilot.press("alt+c")
        await wait_for(pilot, lambda: any("system clipboard" in n for n in app.notices), "the copy")
        assert pasted.read_text() == REPLY
        assert app.notices[-1].endswith(
            f"copied the reply ({len(REPLY)} characters) to the system clipboard (xclip)"
        )


TWO_BLOCKS = "First:\n\n```\nalpha()\n```\n\nThen:\n\n```sh\nbeta --now\n```\n"


@pytest.mark.slow  # drives the app over an engine
async def answered_twice(pilot, app, first: str, second: str) -> list[MessageView]:
    """The views of the current chat's four messages: "a question" answered ``first``, then
    ``second``; the message box focused."""
    await reply(pilot, app, first)
    await reply(pilot, app, second)
    app.chat.prompt.focus()
    return list(app.chat.session_view(app.chat.current).query(MessageView))


@pytest.mark.slow  # drives the app over an engine
async def test_alt_arrows_and_j_k_move_between_messages(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        views = await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        assert [v.entry for v in views] == session.entries
        await pilot.press("alt+up")
        assert app.focused is views[3]
        await pilot.press("k", "k")
        assert app.focused is views[1]
        await pilot.press("j")
        assert app.focused is views[2]
        await pilot.press("alt+down", "j")  # j at the last message stays there
        assert app.focused is views[3]
        await pilot.press("alt+up")
        assert app.focused is views[2]
        await pilot.press("alt+down", "alt+down")  # past the last: the box
        assert app.focused is app.chat.prompt


@pytest.mark.slow  # drives the app over an engine
async def test_c_copies_the_focused_message(tmp_path, no_display):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        await pilot.press("alt+up", "c")
        assert app.clipboard == TWO_BLOCKS


@pytest.mark.slow  # drives the app over an engine
async def test_b_on_two_code_blocks_copies_the_one_picked(tmp_path, no_display):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        await pilot.press("alt+up", "b")  # two blocks: pick one
        await opened(pilot, CodeBlockPicker)
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: app.clipboard == "beta --now", "the second block")


@pytest.mark.slow  # drives the app over an engine
@pytest.mark.parametrize(
    ("key", "notice"),
    [("b", "this message has no code block"), ("e", "only your own messages can be edited")],
)
async def test_a_key_that_does_not_fit_the_reply_says_why(tmp_path, key, notice):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        await pilot.press("alt+up", "k", "k", key)
        assert notice in app.notices[-1]


@pytest.mark.slow  # drives the app over an engine
async def test_e_on_an_earlier_message_puts_it_in_the_box_dropping_nothing(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        await pilot.press("alt+up", "k", "k", "k", "e")
        assert app.focused is app.chat.prompt and app.chat.prompt.text == "a question"
        assert len(session.entries) == 4 and session.editing is session.entries[0]


@pytest.mark.slow  # drives the app over an engine
async def test_e_on_the_last_message_edits_it_to_fork_there(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await answered_twice(pilot, app, "no code here", TWO_BLOCKS)
        await pilot.press("alt+up", "k", "e")  # sending it will fork there
        assert app.chat.prompt.text == "a question" and len(session.entries) == 4
        assert session.editing is session.entries[2]


@pytest.mark.slow  # drives the app over an engine
async def test_r_on_a_question_says_only_replies_are_asked_again(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await answered_twice(pilot, app, "first answer", "second answer")
        await pilot.press("alt+up", "k", "r")
        assert "r asks again for a reply" in app.notices[-1]


@pytest.mark.slow  # drives the app over an engine
async def forked_first_reply(pilot, app) -> list[list[dict[str, str]]]:
    """`answered_twice` ("first answer", "second answer"), then r on the first reply: its new
    version "another first answer" done (a fork there); what was submitted for it."""
    session = app.chat.current
    await answered_twice(pilot, app, "first answer", "second answer")
    submitted = fake_submits(app)
    await pilot.press("alt+up", "k", "k", "r")
    await wait_for(pilot, lambda: submitted, "the new request")
    app.chats.requests.deliver(reply_update("fake-1", "another first answer", True))
    await other_version_done(pilot, session, "another first answer")
    return submitted


@pytest.mark.slow  # drives the app over an engine
async def test_r_on_an_earlier_reply_asks_again_as_a_fork_there(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        submitted = await forked_first_reply(pilot, app)
        assert [m["content"] for m in submitted[0][1:]] == ["a question"]
        assert [e.content for e in session.entries] == ["a question", "another first answer"]
        assert session.entries[1].place().forked


async def delete_asked(pilot, app) -> None:
    """`forked_first_reply`, then d on that reply: its Confirm dialog on show."""
    await forked_first_reply(pilot, app)
    app.chat.prompt.focus()
    await pilot.press("alt+up", "d")
    await opened(pilot, Confirm)


@pytest.mark.slow  # drives the app over an engine
async def test_d_asks_before_deleting_and_escape_keeps_the_message(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await delete_asked(pilot, app)
        assert app.screen.question == "Delete this reply?"
        assert app.screen.detail == (
            "It is the last message. ctrl+z or /undo brings it back until the chat closes."
        )
        await pilot.press("escape")
        await pilot.pause()
        assert len(session.entries) == 2 and isinstance(app.focused, MessageView)


@pytest.mark.slow  # drives the app over an engine
async def test_deleting_a_version_brings_the_other_back(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await delete_asked(pilot, app)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(session.entries) == 4, "the deletion")
        assert [e.content for e in session.entries] == [
            "a question",
            "first answer",
            "a question",
            "second answer",
        ]
        assert not session.entries[1].place().forked


@pytest.mark.slow  # drives the app over an engine
async def test_a_draft_in_a_chat_with_no_messages_survives_a_restart(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        empty = app.chat.current
        await type_text(pilot, app, "an unsent first thought")
        await pilot.press("ctrl+n")
        await opened(pilot, PersonaPicker)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(app.chats.sessions) == 2, "a second chat")
        assert empty.store_id is not None  # saved for its draft, with no message in it
        await type_text(pilot, app, "typed, then taken back")
        await pilot.press(*["backspace"] * len("typed, then taken back"))
        await pilot.press("alt+1")
        await type_text(pilot, app, " (still here)")  # the chat on show at quit keeps its too
    with Store.open() as store:
        rows = store.list_sessions()
        assert [(r.message_count, r.draft) for r in rows] == [
            (0, "an unsent first thought (still here)")
        ]  # the empty chat left no row

    again = offline_app(tmp_path)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert [s.store_id for s in again.chats.sessions] == [empty.store_id]
        assert again.chat.prompt.text == "an unsent first thought (still here)"

        # emptied and left: the chat has nothing to keep, and is not saved any more
        await pilot.press(*["backspace"] * len("an unsent first thought (still here)"))
        await pilot.press("ctrl+n")
        await opened(pilot, PersonaPicker)
        await pilot.press("escape")
    with Store.open() as store:
        assert store.list_sessions() == []


def burst(app, keys: list[tuple[str, str]]) -> None:
    """Keys as one read of the terminal gives them (a paste, fast typing): posted to the app
    together, before any of them is handled."""
    for key, character in keys:
        app.post_message(events.Key(key, character))


SLASH_EDIT = [("slash", "/"), ("e", "e"), ("d", "d"), ("i", "i"), ("t", "t"), ("enter", "\r")]


@pytest.mark.slow  # drives the app over an engine
async def test_typing_on_a_focused_message_goes_to_the_message_box(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await reply(pilot, app, "first answer")
        await reply(pilot, app, "second answer")
        views = list(app.chat.session_view(session).query(MessageView))
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.press("alt+down")  # from the box, either way: the message nearest it
        assert app.focused is views[3]
        await pilot.press("escape")
        assert app.focused is prompt
        await pilot.press("alt+up", "k")
        assert app.focused is views[2]

        # "/edit" and enter in one burst: the slash command, never e (edit) then d (delete)
        burst(app, SLASH_EDIT)
        await wait_for(pilot, lambda: prompt.text == "a question", "the message to edit")
        assert not isinstance(app.screen, Confirm) and len(session.entries) == 4
        assert session.editing is session.entries[2] and app.focused is prompt

        # a key that is no message key goes to the box with its character
        prompt.load_text("")
        await pilot.press("alt+up", "x", "y")
        assert prompt.text == "xy" and app.focused is prompt
        prompt.load_text("")
        await pilot.press("alt+up", "k", "k")  # the reply above: its keys act
        assert app.focused is views[1]
        burst(app, [("r", "r"), ("d", "d"), ("e", "e")])  # r acts, the rest of the burst is text
        await wait_for(pilot, lambda: prompt.text == "de", "the burst in the box")
        await wait_for(pilot, lambda: session.streaming, "r: the reply asked again")
        assert not isinstance(app.screen, Confirm) and app.focused is prompt


@pytest.mark.slow  # drives the app over an engine
async def test_delete_asks_with_cancel_first_and_can_be_undone(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await reply(pilot, app, "first answer")
        await reply(pilot, app, "second answer")
        app.chat.prompt.focus()
        await pilot.press("alt+up", "k", "k", "d")  # the first reply, and the turn after it
        await opened(pilot, Confirm)
        await pilot.press("enter")  # enter: the focused button, Cancel
        await wait_for(pilot, lambda: not isinstance(app.screen, Confirm), "the dialog to go")
        assert len(session.entries) == 4

        await pilot.press("d")
        await opened(pilot, Confirm)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(session.entries) == 1, "the deletion")
        assert app.notices[-1] == (
            "information: deleted this reply and the 2 after it: undo with ctrl+z or /undo"
        )
        with Store.open() as store:
            assert len(store.messages(session.store_id)) == 1

        app.chat.prompt.focus()
        await pilot.press("ctrl+z")  # the box is empty: the chat's undo
        await wait_for(pilot, lambda: len(session.entries) == 4, "the undo")
        assert [e.content for e in session.entries] == [
            "a question",
            "first answer",
            "a question",
            "second answer",
        ]
        views = list(app.chat.session_view(session).query(MessageView))
        assert [v.entry for v in views] == session.entries
        assert "information: brought back the reply" in app.notices
        await app.chat.submit_prompt("/undo")
        assert "error: there is no deleted message to bring back" in app.notices
    with Store.open() as store:  # saved again, in order, on the path on show
        path = store.messages(session.store_id, active_only=True)
        assert [m.content for m in path] == [
            "a question",
            "first answer",
            "a question",
            "second answer",
        ]


@pytest.mark.slow  # drives the app over an engine
async def test_switching_versions_keeps_the_focus_on_the_message(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await reply(pilot, app, "first answer")
        submitted = fake_submits(app)
        await app.chat.perform(BY_ID["regenerate"])
        app.chats.requests.deliver(reply_update(f"fake-{len(submitted)}", "second answer", True))
        await other_version_done(pilot, session, "second answer")
        await app.chat.submit_prompt("next question")
        app.chats.requests.deliver(reply_update(f"fake-{len(submitted)}", "third", True))
        await wait_for(pilot, lambda: session.entries[-1].status == "done", "the third reply")
        app.chat.prompt.focus()
        await pilot.press("alt+up", "k", "k", "left_square_bracket")
        await wait_for(
            pilot, lambda: session.entries[1].content == "first answer", "the first version"
        )
        await pilot.pause()
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.focused, MessageView) and app.focused.entry is session.entries[1]
            ),
            "the focus on it",
        )
        await pilot.press("right_square_bracket")
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.focused, MessageView)
                and app.focused.entry.content == "second answer"
            ),
            "the focus on it",
        )


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_ctrl_c_stops_the_reply_first_and_quits_when_pressed_again(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        fake_submits(app)
        cancelled: list[str] = []
        app.client.cancel = cancelled.append
        await app.chat.submit_prompt("a long answer, please")
        app.chats.requests.deliver(reply_update("fake-1", "once upon", False))
        await wait_for(pilot, lambda: session.entries[-1].content == "once upon", "the stream")
        await pilot.press("ctrl+c")
        assert cancelled == ["fake-1"] and app.is_running
        assert app.notices[-1] == "information: stopped the reply; ctrl+c again quits"
        app.chats.requests.deliver(stopped("fake-1"))
        await wait_for(pilot, lambda: session.entries[-1].status == "stopped", "the stop")
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running, "the quit")


async def test_a_pending_edit_shows_and_escape_cancels_it(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await reply(pilot, app, "first answer")
        info = app.chat.query_one("#prompt-info")
        app.chat.prompt.focus()
        await pilot.press("alt+e")
        assert session.editing is session.entries[0]
        assert "editing message 1 — esc to cancel" in str(info.render())
        await pilot.press("escape")
        assert session.editing is None and app.chat.prompt.text == ""
        assert "editing" not in str(info.render())


async def test_a_fast_keep_command_typed_on_the_panes_and_the_version_count(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        await samples_on_show(pilot, app, "two ways?", ["one way", "another way"])
        burst(
            app,
            [
                ("slash", "/"),
                *((c, c) for c in "keep"),
                ("space", " "),
                ("1", "1"),
                ("enter", "\r"),
            ],
        )
        await wait_for(pilot, lambda: not session.choosing, "the keep")
        assert session.entries[-1].content == "one way" and app.chat.prompt.text == ""
        assert not any(n.startswith("error") for n in app.notices[1:])
        view = app.chat.session_view(session).query(MessageView).last()
        await wait_for(
            pilot,
            lambda: any("1/2" in str(w.render()) for w in view.query(".message-versions")),
            "the version count of the kept reply",
        )


@pytest.mark.slow  # drives the app over an engine
async def test_the_draft_is_saved_as_it_changes(tmp_path):
    """What a crash would find in the store: the draft as it was a moment ago, deleted text
    included (not the draft of the last switch)."""
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await reply(pilot, app)
        chat = app.chat.current.store_id
        store = app.saved.store
        await type_text(pilot, app, "half a thought")
        await wait_for(pilot, lambda: store.draft(chat) == "half a thought", "the draft saved")
        await pilot.press(*["backspace"] * len(" thought"))
        await wait_for(pilot, lambda: store.draft(chat) == "half a", "the shorter draft saved")


async def test_a_long_prefill_shows_its_progress(tmp_path):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        session = app.chat.current
        fake_submits(app)
        await app.chat.submit_prompt("a long paste")
        app.chats.requests.deliver(
            RequestUpdate("fake-1", (), Usage(prompt_tokens=6000, prefilled_tokens=2048))
        )
        view = app.chat.session_view(session).query(MessageView).last()
        await wait_for(pilot, lambda: view.query(".message-foot"), "the reply's view")
        foot = view.query_one(".message-foot")
        await wait_for(
            pilot,
            lambda: "reading the prompt: 2,048 / 6,000 tokens" in str(foot.render()),
            "the prefill progress",
        )
        app.chats.requests.deliver(reply_update("fake-1", "done reading", True))
        await wait_for(
            pilot,
            lambda: "reading" not in str(foot.render()) and "7 tokens" in str(foot.render()),
            "the reply's stats",
        )
