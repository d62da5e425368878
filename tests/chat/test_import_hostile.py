"""Imported and saved chats that hold what chatpage never writes: an import refuses them in one
line (or drops a null that means "none"), and a saved chat that cannot be read is skipped and
named at start and when opened, never taking the other chats with it (real SQLite stores under
the test's XDG dirs, the real CLI parser, the real app driven by Pilot)."""

from __future__ import annotations

import argparse
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from helpers import offline_app, wait_for

from chatpage.chat.saved import load_session, restore
from chatpage.cli import history as history_cli
from chatpage.config.paths import data_dir
from chatpage.config.personas import Persona
from chatpage.store import DB_NAME, Store
from chatpage.store.io import export_session, import_json

PERSONA = Persona("assistant", "the test persona", "Be brief.")


def export(messages: list[dict]) -> str:
    return json.dumps(
        {
            "format": "chatpage-session",
            "version": 2,
            "title": "Imported",
            "persona": "assistant",
            "messages": [
                {"id": n, "parent": n - 1 or None, "content": f"text {n}", **m}
                for n, m in enumerate(messages, 1)
            ],
        }
    )


def cli_import(path: Path) -> int:
    main = argparse.ArgumentParser(prog="chatpage")
    history_cli.register(main.add_subparsers(dest="command"))
    args = main.parse_args(["import", str(path)])
    return args.func(args)


def test_null_metadata_means_none_and_the_chat_opens():
    text = export(
        [
            {"role": "user", "metadata": {"attachments": None}},
            {"role": "assistant", "metadata": {"reasoning": None, "label": "x", "own": [1]}},
        ]
    )
    with Store.open() as store:
        chat = import_json(store, text)
        saved = json.loads(export_session(store, chat, "json"))["messages"]
        assert [m["metadata"] for m in saved] == [{}, {"label": "x", "own": [1]}]
        session, note = load_session(store, store.get_session(chat), [PERSONA], PERSONA, 1)
    assert note is None and [e.content for e in session.entries] == ["text 1", "text 2"]


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ({"metadata": {"attachments": "notes.txt"}}, "metadata 'attachments' must be a list"),
        ({"metadata": {"attachments": [{"name": 3}]}}, "metadata 'attachments' must be a list"),
        ({"metadata": {"reasoning": 5}}, "metadata 'reasoning' must be text"),
        ({"metadata": {"reasoning_tokens": "9"}}, "'reasoning_tokens' must be a whole number"),
        ({"metadata": {"token_ids": ["a"]}}, "'token_ids' must be a list of whole numbers"),
        ({"metadata": {"tool_steps": {"calls": []}}}, "metadata 'tool_steps' must be a list"),
        ({"metadata": {"tool_steps": [{"calls": "x"}]}}, "metadata 'tool_steps' must be a list"),
    ],
)
def test_metadata_of_the_wrong_kind_is_refused_naming_the_message(message, said):
    text = export([{"role": "user"}, {"role": "assistant", **message}])
    with Store.open() as store:
        with pytest.raises(ValueError, match="^message 2: ") as caught:
            import_json(store, text)
        assert said in str(caught.value) and store.list_sessions() == []


def test_json_nested_deep_is_one_line_from_the_cli(tmp_path, capsys):
    path = tmp_path / "deep.json"
    for depth in (100_000, 40):
        path.write_text("[" * depth + "]" * depth)
        assert cli_import(path) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "nests deeper than 32 levels" in err, err
    nested: dict = {}
    for _ in range(40):
        nested = {"x": nested}
    path.write_text(export([{"role": "user", "metadata": {"own": nested}}]))
    assert cli_import(path) == 1
    assert "nests deeper than 32 levels" in capsys.readouterr().err


def saved_chats(store: Store) -> tuple[int, int, int]:
    """Three open chats: a good one, one as an older import saved it ("attachments": null),
    one whose message has a status chatpage never writes (as another program may have saved)."""
    good = store.create_session("Good chat", "assistant")
    store.add_message(good, "user", "hello")
    nulls = store.create_session("Null attachments", "assistant")
    store.add_message(nulls, "user", "see file", metadata={"attachments": None})
    broken = store.create_session("Broken chat", "assistant")
    message = store.add_message(broken, "user", "hi")
    with closing(sqlite3.connect(data_dir() / DB_NAME)) as other, other:
        other.execute("UPDATE messages SET status = 'bogus' WHERE id = ?", (message,))
    return good, nulls, broken


def test_a_chat_that_cannot_be_read_is_skipped_and_named():
    with Store.open() as store:
        good, nulls, broken = saved_chats(store)
        sessions, notes = restore(store, [PERSONA], PERSONA, first_id=1)
        assert [s.store_id for s in sessions] == [nulls, good]  # most recent first
        assert [s.id for s in sessions] == [1, 2]
        (note,) = notes
        assert "the saved chat 'Broken chat' cannot be opened" in note
        assert f"chatpage export {broken}" in note and "\n" not in note
        session, again = load_session(store, store.get_session(broken), [PERSONA], PERSONA, 3)
        assert session is None and again == note


async def test_the_app_starts_with_the_other_chats_and_says_which_is_skipped(tmp_path):
    with Store.open() as store:
        good, nulls, broken = saved_chats(store)
    app = offline_app(tmp_path)
    async with app.run_test(size=(140, 44)) as pilot:
        await wait_for(pilot, lambda: len(app.chats.sessions) == 2, "the restored chats")
        assert [s.title for s in app.chats.sessions] == ["Null attachments", "Good chat"]
        await wait_for(pilot, lambda: any("Broken chat" in n for n in app.notices), "the note")
        assert app.chat.open_saved(broken) is None  # opening it says why, again
        assert sum("Broken chat" in n for n in app.notices) == 2
        assert app.chat.open_saved(good) is app.chats.sessions[1]
        assert app.chat.current.entries[0].content == "hello"
