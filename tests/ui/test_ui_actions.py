"""The table of user actions and what is built from it: the key bindings, the slash commands,
the help screen and the command palette agree with it, with what chatpage offered before the
table, and with the README; every key, slash command, alias and palette entry reaches its
action's handler (Pilot, offline app)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import fake_submits, offline_run, opened, wait_for

from chatpage.ui import palette
from chatpage.ui.actions.action import Action, Controls
from chatpage.ui.actions.table import ACTIONS, BY_ID, BY_SLASH
from chatpage.ui.bindings import APP_BINDINGS, CHAT_BINDINGS, all_bindings
from chatpage.ui.screens.help import HelpScreen
from chatpage.ui.slash_commands import ARGUMENTS, COMMAND_NAMES, help_rows, parse_command

SIZE = (140, 44)
README = Path(__file__).resolve().parents[2] / "README.md"

# What chatpage offered before the table (each must still be there, doing the same).
KEYS_BEFORE = {
    "help": "f1",
    "new_session": "ctrl+n",
    "close_session": "ctrl+w",
    "next_session": "ctrl+tab,ctrl+pagedown",
    "prev_session": "ctrl+shift+tab,ctrl+pageup",
    **{f"goto_session_{n}": f"alt+{n}" for n in range(1, 10)},
    "stop": "escape",
    "regenerate": "ctrl+r",
    "edit_last": "alt+e",
    "cycle_alternatives": "ctrl+a",
    "copy_reply": "alt+c",
    "copy_code": "alt+k",
    "sampling_settings": "f2",
    "search_history": "ctrl+f",
    "toggle_sidebar": "ctrl+b",
    "external_editor": "ctrl+e",
    "focus_prev_message": "alt+up",
    "focus_next_message": "alt+down",
}
ADDED_KEYS = {"cancel_edit", "interrupt", "undo_delete", "toggle_thinking"}  # escape, ctrl+c,
# ctrl+z (#23); alt+t (#22)
ADDED_SLASH = {"undo", "think", "tools", "spec"}
SLASH_BEFORE = {
    "help",
    "new",
    "clear",
    "temp",
    "top_p",
    "top_k",
    "max",
    "seed",
    "samples",
    "beam",
    "single",
    "compare",
    "keep",
    "file",
    "detach",
    "stop",
    "regen",
    "edit",
    "continue",
    "copy",
    "title",
    "search",
    "export",
    "settings",
    "system",
    "persona",
    "model",
    "saveas",
    "quit",
}
ALIASES_BEFORE = {
    "regenerate": "regen",
    "exit": "quit",
    "attach": "file",
    "off": "single",
    "temperature": "temp",
    "max_tokens": "max",
    "topp": "top_p",
    "topk": "top_k",
}
PALETTE_BEFORE = {
    "Switch model",
    "New chat",
    "Close",
    "Next chat",
    "Previous chat",
    "Stop",
    "Regenerate",
    "Edit last",
    "Alternatives",
    "Copy reply",
    "Copy code",
    "Sampling",
    "Search chats",
    "Sidebar",
    "Editor",
    "Previous message",
    "Next message",
    "Next reply: samples",
    "Next reply: beam search",
    "Next reply: single",
    "Edit this chat's system prompt",
    "Switch this chat's persona",
    "Save this chat as a persona",
    "Export chat as Markdown",
    "Export chat as JSON",
    "Delete chat",
}


def first_key(action: Action) -> str:
    return action.key.split(",")[0]


# -- the table and what is built from it ---------------------------------------------------------
def test_ids_slash_names_and_aliases_are_unique():
    assert len(BY_ID) == len(ACTIONS)
    names = [n for a in ACTIONS if a.slash for n in (a.slash, *a.aliases)]
    assert len(names) == len(set(names)) == len(BY_SLASH)
    assert all(not a.aliases for a in ACTIONS if not a.slash)
    assert COMMAND_NAMES == {a.slash for a in ACTIONS if a.slash}
    # tab completes persona names after /new and /persona, paths after /file (and /attach)
    assert ARGUMENTS == {"new": "persona", "persona": "persona", "file": "path", "attach": "path"}


def test_bindings_are_the_keyed_actions():
    bindings = {b.id: b for b in [*APP_BINDINGS, *CHAT_BINDINGS]}
    assert set(bindings) == {a.id for a in ACTIONS if a.key}
    for action in ACTIONS:
        if action.key:
            b = bindings[action.id]
            assert (b.key, b.action, b.description, b.show, b.priority) == (
                action.key,
                f"act({action.id!r})",
                action.title,
                action.show,
                action.priority,
            )
    assert [b.id for b in APP_BINDINGS] == ["help"]
    ids = [b.id for b in all_bindings()]
    assert len(ids) == len(set(ids))  # config.yaml's bindings: names one key each


def test_the_slash_parser_finds_every_name_and_alias():
    for action in ACTIONS:
        for name in (action.slash, *action.aliases) if action.slash else ():
            command = parse_command(f"  /{name.upper()}   some text ")
            assert command is not None
            assert command.action is action and command.arg == "some text"
            assert action.usage.split(" ")[0] == f"/{action.slash}" and action.help
    with pytest.raises(ValueError, match="unknown command /nope"):
        parse_command("/nope")


def test_help_and_palette_rows_come_from_the_table():
    assert help_rows() == [(a.usage, a.help) for a in ACTIONS if a.slash]
    keyed = [
        a
        for a in ACTIONS
        if a.key and not a.id.startswith("goto_session") and a.id != "cancel_edit"
    ]  # escape while editing: no palette entry of its own
    for action in keyed:
        assert action.palette_entries(lambda _id: None) == (
            action.palette_entries(lambda _id: None)[0],
        )
        entry = action.palette_entries(lambda _id: "f9,f10")[0]
        assert (entry.title, entry.help, entry.arg) == (action.title, f"{action.title} (f9)", None)
    assert not any(
        a.palette_entries(lambda _id: None) for a in ACTIONS if a.id.startswith("goto_session")
    )


def test_what_there_was_before_the_table_is_all_still_there():
    keys = {a.id: a.key for a in ACTIONS if a.key}
    assert KEYS_BEFORE.items() <= keys.items()
    assert keys.keys() - KEYS_BEFORE.keys() == ADDED_KEYS
    assert {a.slash for a in ACTIONS if a.slash} == SLASH_BEFORE | ADDED_SLASH
    assert {alias: BY_SLASH[alias].slash for a in ACTIONS for alias in a.aliases} == ALIASES_BEFORE
    titles = {e.title for a in ACTIONS for e in a.palette_entries(lambda _id: None)}
    assert PALETTE_BEFORE <= titles
    assert titles - PALETTE_BEFORE == {
        "Help",
        "Stop or quit",
        "Undo delete",
        "Show thinking",
        "MCP tools",
    }


KEY_NAMES = {"[": "left_square_bracket", "]": "right_square_bracket"}
"""The README writes these keys as they are typed."""


def test_the_readme_key_table_and_slash_commands_are_true():
    readme = README.read_text()
    keys = {b.id: b.key.split(",") for b in all_bindings()}
    table = readme[readme.index("| key | id | action |") : readme.index("Slash commands:")]
    rows = re.findall(r"^\| ([^|]+) \| ([a-z_N, /]+) \| [^|]+ \|$", table, re.M)[1:]
    assert len(rows) > 15
    for key_cell, id_cell in rows:
        ids = [i.strip() for i in re.split(r"[/,]", id_cell)]
        cell_keys = [k.strip() for k in re.split(r" / |, ", key_cell)]
        if ids[0].endswith("_N"):  # alt+1 ... alt+9 / 1 ... 6
            first, _, last = key_cell.partition(" ... ")
            prefix = first[:-1]
            for n in range(int(first[-1]), int(last[-1]) + 1):
                assert keys[f"{ids[0][:-1]}{n}"] == [f"{prefix}{n}"]
        elif len(ids) == len(cell_keys):
            for binding_id, key in zip(ids, cell_keys, strict=True):
                assert KEY_NAMES.get(key, key) in keys[binding_id], (binding_id, key)
        else:
            (binding_id,) = ids
            assert sorted(cell_keys) == sorted(keys[binding_id])
    listed = readme[readme.index("Slash commands:") :]
    listed = listed[: listed.index("\n\n")]
    named = set(re.findall(r"`/([a-z_]+)", listed))
    assert named == SLASH_BEFORE | ADDED_SLASH


# -- every way in reaches the handler --------------------------------------------------------------
def recording(calls: list[tuple[str, str | None]], action: Action) -> Action:
    async def run(controls: Controls, arg: str | None) -> None:
        calls.append((action.id, arg))

    return replace(action, run=run)


@pytest.mark.slow  # drives the app over an engine
async def test_every_key_slash_command_and_palette_entry_runs_its_handler(tmp_path, monkeypatch):
    calls: list[tuple[str, str | None]] = []
    recorded = {a.id: recording(calls, a) for a in ACTIONS}
    for action_id, action in recorded.items():
        monkeypatch.setitem(BY_ID, action_id, action)
    for name, action in list(BY_SLASH.items()):
        monkeypatch.setitem(BY_SLASH, name, recorded[action.id])
    monkeypatch.setattr(palette, "ACTIONS", tuple(recorded.values()))
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        fake_submits(app)
        await app.chat.submit_prompt("hello")  # streaming: the stop key is live
        assert app.chat.current.streaming
        for action in ACTIONS:  # (cancel_edit, escape while editing: in test_ui_keys)
            if action.key and (action.active is None or action.active(app.chat)):
                app.chat.prompt.focus()
                await pilot.press(first_key(action))
                assert calls[-1:] == [(action.id, None)], action.id
        calls.clear()
        for name, action in BY_SLASH.items():
            await app.chat.submit_prompt(f"/{name} an argument")
            assert calls[-1:] == [(action.id, "an argument")], name
        calls.clear()
        commands = {c.title: c for c in app.get_system_commands(app.chat)}
        for action in ACTIONS:
            for entry in action.palette_entries(app.key_for):
                await commands[entry.title].callback()
                assert calls[-1:] == [(action.id, entry.arg)], entry.title


@pytest.mark.slow  # drives the app over an engine
async def test_help_by_key_and_by_slash_shows_the_table(tmp_path):
    async with offline_run(tmp_path, SIZE, bindings={"regenerate": "f6"}) as (app, pilot):
        for ask in ("key", "slash"):
            if ask == "key":
                await pilot.press("f1")
            else:
                await app.chat.submit_prompt("/help")
            await opened(pilot, HelpScreen)
            help_screen = app.screen
            assert help_screen.commands == help_rows()
            rows = {i: (k, d) for k, i, d in help_screen.keys}
            for action in ACTIONS:
                if action.key:
                    key = "f6" if action.id == "regenerate" else action.key
                    assert rows[action.id] == (key, action.title)
            assert {"keep_1", "transcript_next", "message_copy"} <= set(rows)
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.chat, "the help closed")
