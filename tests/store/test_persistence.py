"""Chats saved in SQLite and brought back: the real app (Textual Pilot), its store, a restart,
export/search/close/delete from the UI, store faults and settings warnings as notices, and a
kill -9 in the middle of a reply (a subprocess).

XDG dirs point into each test's tmp dir (tests/conftest.py), so every test has its own database.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import (
    facts,
    idle,
    make_app,
    offline_app,
    offline_run,
    opened,
    palette_offers,
    ready,
    send,
    tiny_run,
    wait_for,
)
from textual.widgets import Input

from chatpage.chat.saved import restore
from chatpage.config.paths import data_dir
from chatpage.config.personas import Persona
from chatpage.config.settings import config_path, load_settings
from chatpage.engine.config import EngineConfig
from chatpage.store import DB_NAME, Store
from chatpage.ui.app import ChatApp
from chatpage.ui.screens.chat_search import ChatSearch
from chatpage.ui.screens.confirm import Confirm
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.session_list import SessionList

SIZE = (140, 44)


def sidebar_titles(app) -> list[str]:
    sidebar = app.chat.query_one(SessionList)
    return [
        str(sidebar.get_option_at_index(i).prompt).split("\n")[0]
        for i in range(sidebar.option_count)
    ]


@pytest.mark.slow  # drives the app over the store, restarted
async def test_chats_come_back_after_a_restart_and_continue(tiny_llama_dir, personas_dir):
    async with tiny_run(tiny_llama_dir, personas_dir, SIZE) as (app, pilot):
        first = app.chat.current
        await send(pilot, "What is paged attention?")
        await wait_for(pilot, lambda: idle(app), "the first reply")
        await send(pilot, "/title Paging notes")
        await send(pilot, "/new beta")
        second = app.chat.current
        await send(pilot, "/temp 0.9")
        await send(pilot, "/samples 2")
        await send(pilot, "Write a haiku")
        await wait_for(pilot, lambda: second.choosing and not second.streaming, "the samples")
        texts = [c.text for c in second.generation.candidates]
        await send(pilot, "/keep 2")
        originals = {s.store_id: facts(s.entries) for s in (first, second)}
    assert stat.S_IMODE(data_dir().stat().st_mode) == 0o700  # the data dir is private

    with Store.open() as store:
        assert [s.title for s in store.list_sessions()] == ["Write a haiku", "Paging notes"]
        siblings = [
            (m.content, m.kept) for m in store.messages(second.store_id) if m.role == "assistant"
        ]
        assert siblings == [(texts[0], False), (texts[1], True)]  # both kept, as versions

    again = make_app(tiny_llama_dir, personas_dir)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        haiku, paging = again.chats.sessions
        assert again.chat.current is haiku  # the most recent chat is shown
        assert sidebar_titles(again)[0].endswith("Write a haiku")
        assert sidebar_titles(again)[1].endswith("Paging notes")
        assert (haiku.persona.name, paging.persona.name) == ("beta", "alpha")
        assert facts(haiku.entries) == originals[second.store_id]
        assert facts(paging.entries) == originals[first.store_id]
        assert haiku.entries[-1].label == "sample 2" and haiku.entries[-1].content == texts[1]
        assert haiku.sampling.temperature == 0.9
        await wait_for(
            pilot,
            lambda: len(again.chat.session_view(haiku).query(MessageView)) == 2,
            "the restored messages",
        )

        # continuing a restored chat sends its whole history; the persona prefix is cached
        await pilot.press("alt+2")
        assert again.chat.current is paging
        await ready(pilot, again)
        await send(pilot, "And what about swapping?")
        await wait_for(pilot, lambda: idle(again), "the reply to the restored chat")
        reply = paging.entries[-1]
        assert reply.status == "done" and reply.stats.tokens > 0
        assert reply.stats.prompt_tokens > reply.stats.prefix_hit_tokens > 0
    with Store.open() as store:
        assert [m.role for m in store.active_path(first.store_id)] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]


def saved_chat(store: Store, title: str, *texts: str, persona: str = "assistant") -> int:
    chat = store.create_session(title, persona)
    for n, text in enumerate(texts):
        store.add_message(chat, ("user", "assistant")[n % 2], text)
    return chat


@pytest.fixture
def saved(tmp_path, monkeypatch) -> tuple[Path, int, int]:
    """(work, paging, poems): two saved chats, "Paging notes" open with a reply cut by a crash
    and "Poems [b]" closed; exports go to ``work``, the current directory."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with Store.open() as store:
        paging = saved_chat(
            store,
            "Paging notes",
            "How does paged attention work?",
            "It splits the **KV cache** into blocks.",
            "And swapping?",
        )
        store.add_message(paging, "assistant", "Swapping moves", status="streaming")  # a crash
        poems = saved_chat(
            store, "Poems [b]", "Write a haiku about [bold]café[/bold] mornings", "Steam rises"
        )
        store.set_closed(poems, True)
    return work, paging, poems


async def search_and_open(pilot, query: str) -> None:
    """ctrl+f, type ``query``, enter: the first hit opens."""
    await pilot.press("ctrl+f")
    await opened(pilot, ChatSearch)
    await pilot.press(*query, "enter")
    await pilot.pause()


async def test_open_chats_come_back_with_a_cut_reply_interrupted(tmp_path, saved):
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        assert [s.title for s in app.chats.sessions] == ["Paging notes"]  # closed: not reopened
        session = app.chat.current
        assert [e.content for e in session.entries][0] == "How does paged attention work?"
        assert session.entries[-1].status == "interrupted"
        await wait_for(
            pilot,
            lambda: len(app.chat.session_view(session).query(MessageView)) == 4,
            "the restored messages",
        )
        last = app.chat.session_view(session).query(MessageView).last()
        assert "interrupted" in str(last.query_one(".message-speaker").render())


@pytest.mark.slow  # drives the app over the store, restarted
async def test_a_chat_exports_as_markdown_and_as_json_never_overwriting(tmp_path, saved):
    work, paging, _ = saved
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        await palette_offers(pilot, "as markdown")
        await pilot.press("enter")
        await wait_for(pilot, lambda: list(work.glob("*.md")), "the Markdown file")
        (md,) = work.glob("*.md")
        assert md.name.startswith(f"chatpage-{paging}-paging-notes-")
        text = md.read_text()
        assert text.startswith("# Paging notes\n") and "It splits the **KV cache**" in text
        assert any(str(md) in n for n in app.notices)
        export_json = next(
            c for c in app.get_system_commands(app.screen) if c.title == "Export chat as JSON"
        )
        await export_json.callback()
        (exported,) = work.glob("*.json")
        assert json.loads(exported.read_text())["title"] == "Paging notes"
        await export_json.callback()  # a second export never overwrites the first
        assert len(list(work.glob("*.json"))) == 2


@pytest.mark.slow  # drives the app over the store, restarted
async def test_search_opens_a_closed_chat_and_shows_brackets_literally(tmp_path, saved):
    _, _, poems = saved
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        await pilot.press("ctrl+f")
        await opened(pilot, ChatSearch)
        await pilot.press(*"cafe")
        await wait_for(pilot, lambda: app.screen.query_one(Input).value == "cafe", "the query")
        hits = app.screen.hits
        assert [h.session_id for h in hits.values()] == [poems]
        prompt = str(app.screen.query_one("#dialog-options").get_option_at_index(0).prompt)
        assert "Poems [b]" in prompt and "haiku about [bold]café[/bold] mornings" in prompt
        await pilot.press("enter")
        await pilot.pause()
        assert app.chat.current.store_id == poems
        assert [s.title for s in app.chats.sessions] == ["Paging notes", "Poems [b]"]
        with Store.open() as store:
            assert not store.get_session(poems).closed


@pytest.mark.slow  # drives the app over the store, restarted
async def test_search_for_an_open_chat_switches_to_it(tmp_path, saved):
    _, _, poems = saved
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        session = app.chat.current
        await search_and_open(pilot, "cafe")
        assert app.chat.current.store_id == poems
        await search_and_open(pilot, "paged")
        assert app.chat.current is session


@pytest.mark.slow  # drives the app over the store, restarted
async def test_closing_keeps_the_chat_saved_and_the_palette_offers_it(tmp_path, saved):
    _, _, poems = saved
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        await search_and_open(pilot, "cafe")
        await pilot.press("alt+2", "ctrl+w")
        await pilot.pause()
        assert [s.title for s in app.chats.sessions] == ["Paging notes"]
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Open saved chat: Poems \\[b]" in titles
        with Store.open() as store:
            assert store.get_session(poems).closed


@pytest.mark.slow  # drives the app over the store, restarted
async def test_delete_asks_then_removes_the_chat_from_the_store(tmp_path, saved):
    _, paging, poems = saved
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        await pilot.pause()
        session = app.chat.current
        delete = next(c for c in app.get_system_commands(app.screen) if c.title == "Delete chat")
        await delete.callback()
        await pilot.pause()
        await opened(pilot, Confirm)
        await pilot.press("escape")
        await pilot.pause()
        assert app.chat.current is session
        await delete.callback()
        await pilot.pause()
        await pilot.press("y")
        await wait_for(pilot, lambda: app.chat.current is not session, "the deletion")
        assert app.chat.current.entries == [] and len(app.chats.sessions) == 1  # a fresh chat
        with Store.open() as store:
            assert store.get_session(paging) is None and store.get_session(poems) is not None


async def test_corrupt_database_is_moved_aside_and_the_app_starts_fresh(tmp_path):
    path = data_dir() / DB_NAME
    path.parent.mkdir(parents=True)
    path.write_bytes(b"definitely not SQLite " * 300)
    app = offline_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        (moved,) = path.parent.glob(DB_NAME + ".corrupt-*")
        notice = next(n for n in app.notices if "could not be read" in n)
        assert notice.startswith("warning:") and str(moved) in notice
        assert app.store.persistent and len(app.chats.sessions) == 1
        assert app.chat.current.entries == []
        assert "not saving" not in app.chat.query_one(BlockGauge).render().plain
    assert moved.read_bytes().startswith(b"definitely not SQLite")


async def test_unwritable_data_dir_runs_without_saving(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")
    monkeypatch.setenv("XDG_DATA_HOME", str(blocker))
    async with offline_run(tmp_path, SIZE) as (app, pilot):
        app.client.error = None  # pretend the model loaded: submits go nowhere
        app.client.submit = lambda request, on_update: "fake-1"
        notice = next(n for n in app.notices if "without saving" in n)
        assert notice.startswith("warning:") and str(blocker) in notice
        assert not app.store.persistent
        status = app.chat.query_one(BlockGauge).render().plain.split("\n")[0]
        assert "not saving: cannot use" in status
        await send(pilot, "kept in memory")  # the chat works; the memory store follows it
        assert app.store.search("memory")[0].session_id == app.chat.current.store_id
    assert blocker.read_text() == "a regular file"


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_bad_settings_are_notices_and_defaults_apply(tmp_path):
    config_path().parent.mkdir(parents=True)
    config_path().write_text("kv_cache: lots\ndefault_persona: nobody\ncolour: red\n")
    settings, warnings = load_settings()
    assert settings.kv_cache == 1 << 30  # the default
    app = ChatApp(
        model=str(tmp_path / "no-such-model"),
        config=EngineConfig(),
        settings=settings,
        warnings=warnings,
    )
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        shown = "\n".join(app.notices)
        assert "kv_cache = 'lots' is not valid" in shown and "unknown setting 'colour'" in shown
        assert "default_persona 'nobody' is not a persona; new chats use 'assistant'" in shown
        assert app.chat.current.persona.name == "assistant"

    coder = offline_app(tmp_path, default_persona="coder")
    async with coder.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert coder.chat.current.persona.name == "coder"
        assert not any("default_persona" in n for n in coder.notices)


# -- kill -9 in the middle of a reply ----------------------------------------------------------------

DRIVER = textwrap.dedent('''
    """Run the app headless, finish one turn, then stream a long reply until killed."""
    import asyncio
    import sys
    import time
    from pathlib import Path

    from chatpage.engine.config import EngineConfig
    from chatpage.config.settings import Settings
    from chatpage.chat import recorder as persistence
    from chatpage.ui.app import ChatApp

    persistence.SAVE_INTERVAL_S = 0.25  # more writes per second than the app's 2 s: robust
                                        # on a fast machine, where the reply ends sooner


    async def until(pilot, condition):
        deadline = time.monotonic() + 120
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            await pilot.pause(0.05)


    async def main():
        app = ChatApp(model=sys.argv[1], config=EngineConfig(kv_cache_bytes=4 << 20),
                      settings=Settings(default_persona="alpha"), personas_dirs=[Path(sys.argv[2])])
        async with app.run_test(headless=True, size=(120, 40)) as pilot:
            session = app.chat.current
            await until(pilot, lambda: app.client.ready)
            await app.chat.submit_prompt("a first question")
            await until(pilot, lambda: session.entries[-1].status == "done")
            for command in ("/max 600", "/temp 1", "/seed 3", "tell me a very long story"):
                await app.chat.submit_prompt(command)
            print("streaming", flush=True)
            await until(pilot, lambda: not session.streaming)
            print("finished before the kill", flush=True)

    asyncio.run(main())
''')


def streaming_text(db: Path) -> str | None:
    """The text saved so far of the long story's reply while it is still marked streaming
    (None before; the first reply may be saved streaming too, on a slow machine)."""
    if not db.exists():
        return None
    conn = sqlite3.connect(db, timeout=5)
    try:
        row = conn.execute(
            "SELECT a.content FROM messages a JOIN messages q ON a.parent_id = q.id "
            "WHERE a.status = 'streaming' AND a.content != '' "
            "AND q.content = 'tell me a very long story'"
        ).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return None
    finally:
        conn.close()
    return row[0] if row else None


@pytest.mark.slow  # a chatpage process of its own, killed mid-reply
def test_kill_9_mid_reply_loses_at_most_the_last_seconds(tiny_llama_dir, personas_dir, tmp_path):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).parents[2]))
    db = data_dir() / DB_NAME  # XDG_DATA_HOME is already the test's (conftest)
    log = tmp_path / "driver.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(driver), str(tiny_llama_dir), str(personas_dir)],
            env=env,
            stdout=out,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 180
        partial = None
        while partial is None:
            assert proc.poll() is None, f"the app exited early:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no streaming reply was saved in time"
            time.sleep(0.05)
            partial = streaming_text(db)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    alpha = Persona("alpha", "", "")
    with Store.open(db) as store:
        assert store.notice is None
        (session,), _ = restore(store, [alpha], alpha, first_id=1)  # the app's start-up logic
        assert [(e.role, e.status) for e in session.entries] == [
            ("user", "done"),
            ("assistant", "done"),
            ("user", "done"),
            ("assistant", "interrupted"),
        ]
        assert session.entries[0].content == "a first question"
        assert session.entries[1].content and session.entries[1].stats.tokens > 0
        assert session.entries[2].content == "tell me a very long story"
        assert session.entries[3].content.startswith(partial)
        assert store.mark_streaming_interrupted() == 0  # restore already marked it
