"""Several chatpage processes opening one database at the same moment (two windows started
together, an upgrade): the schema is migrated once, and a good database is never moved aside."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatpage.store import DB_NAME, Store
from chatpage.store import schema as store_schema
from chatpage.store.schema import SCHEMA_VERSION

pytestmark = pytest.mark.slow  # several processes on one database

OPENER = """
import json, sys, time
from pathlib import Path
from chatpage.store import Store

time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # sleeping: spinning would starve
with Store.open(Path(sys.argv[1])) as store:
    print(json.dumps({"persistent": store.persistent, "notice": store.notice,
                      "chats": [s.title for s in store.list_sessions(closed=False)]}))
"""
PROCESSES = 6


def _open_together(path: Path) -> list[dict]:
    """Start PROCESSES interpreters that all open `path` at one instant (after their imports)."""
    start = time.time() + 3.0
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(path), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    return results


def _v1_database(path: Path) -> None:
    """The schema as chatpage 1 left it, with one chat."""
    conn = sqlite3.connect(path, isolation_level=None)
    store_schema.MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO sessions (title, persona, created_at, updated_at) "
        "VALUES ('old chat', 'assistant', '2024-01-01', '2024-01-01')"
    )
    conn.execute(
        "INSERT INTO messages (session_id, position, role, content, kept, created_at) "
        "VALUES (1, 0, 'user', 'q', 1, '2024-01-01')"
    )
    conn.close()


def _check(path: Path, results: list[dict], chats: list[str]) -> None:
    assert [r["notice"] for r in results] == [None] * PROCESSES
    assert all(r["persistent"] for r in results)
    assert all(r["chats"] == chats for r in results)
    assert not list(path.parent.glob(f"{DB_NAME}.corrupt-*"))  # nothing moved aside
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize("start", ["fresh", "version 1"])
def test_processes_opening_together_share_one_good_database(tmp_path: Path, start: str) -> None:
    for attempt in range(2):
        path = tmp_path / str(attempt) / DB_NAME
        path.parent.mkdir()
        if start == "version 1":
            _v1_database(path)
        _check(path, _open_together(path), [] if start == "fresh" else ["old chat"])


def test_a_schema_error_leaves_the_database_in_place(tmp_path: Path, monkeypatch) -> None:
    """A step that fails (here: a table that is already there) is not corruption: the file
    stays, and this process runs without saving and says why."""
    path = tmp_path / DB_NAME
    _v1_database(path)
    sqlite3.connect(path, isolation_level=None).execute("CREATE TABLE clash (x)")
    monkeypatch.setattr(
        store_schema,
        "MIGRATIONS",
        [
            *store_schema.MIGRATIONS[:1],
            lambda conn: conn.execute("CREATE TABLE clash (x)"),
            *store_schema.MIGRATIONS[2:],
        ],
    )
    with Store.open(path) as store:
        assert not store.persistent
        assert "table clash already exists" in store.notice
    assert not list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
    assert sqlite3.connect(path).execute("SELECT title FROM sessions").fetchall() == [("old chat",)]


def test_a_busy_database_is_not_moved_aside(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / DB_NAME
    with Store.open(path):
        pass
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = DELETE")  # a rollback journal: an exclusive lock
    holder.execute("BEGIN EXCLUSIVE")  # keeps even readers out
    monkeypatch.setattr(
        store_schema,
        "connect",
        lambda target: sqlite3.connect(target, isolation_level=None, timeout=0.1),
    )
    try:
        with Store.open(path) as store:
            assert not store.persistent
            assert "locked" in store.notice
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not list(tmp_path.glob(f"{DB_NAME}.corrupt-*"))
