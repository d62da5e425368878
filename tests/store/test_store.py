"""SQLite store: CRUD, alternatives, search, export/import, migrations and fault handling."""

from __future__ import annotations

import json
import sqlite3
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatpage.chat.entry import Entry, ToolRun, ToolStep
from chatpage.chat.saved import reply_metadata
from chatpage.store import DB_NAME, SNIPPET_MARKS, NotFound, Store, make_title
from chatpage.store import schema as store_schema
from chatpage.store.io import export_session, import_json
from chatpage.store.schema import SCHEMA_VERSION, migrate


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "data" / DB_NAME) as opened:
        yield opened


def chat(store: Store, *turns: str, title: str = "t", persona: str = "assistant") -> int:
    sid = store.create_session(title, persona, {"temperature": 0.2})
    for n, text in enumerate(turns):
        store.add_message(sid, ("user", "assistant")[n % 2], text)
    return sid


def test_default_location_follows_xdg_and_is_private(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    with Store.open() as opened:
        assert opened.persistent and opened.notice is None
        assert opened.path == tmp_path / "xdg" / "chatpage" / DB_NAME
    data = tmp_path / "xdg" / "chatpage"
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    conn = sqlite3.connect(data / DB_NAME)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_session_crud_and_order(store: Store) -> None:
    a = store.create_session("first", "coder", {"temperature": 0.2, "top_k": 5})
    b = store.create_session("second", "writer", None)
    assert [s.id for s in store.list_sessions()] == [b, a]
    store.add_message(a, "user", "hi")  # activity moves a chat to the top
    sessions = store.list_sessions()
    assert [s.id for s in sessions] == [a, b]
    assert sessions[0].settings == {"temperature": 0.2, "top_k": 5}
    assert sessions[0].message_count == 1 and sessions[1].settings == {}
    store.rename_session(a, "renamed")
    store.update_session(b, persona="tutor", settings={"seed": 1})
    assert store.get_session(a).title == "renamed"
    assert (store.get_session(b).persona, store.get_session(b).settings) == ("tutor", {"seed": 1})
    assert [s.id for s in store.list_sessions()] == [a, b]  # renaming does not reorder
    store.delete_session(a)
    assert store.get_session(a) is None and store.messages(a) == []
    assert store.search("hi") == []  # the FTS index follows cascaded deletes
    with pytest.raises(KeyError):
        store.delete_session(a)
    with pytest.raises(KeyError):
        store.rename_session(999, "x")


def test_messages_ordered_and_updated(store: Store) -> None:
    sid = chat(store, "q1", "a1", "q2")
    reply = store.add_message(sid, "assistant", "", status="streaming")
    store.update_message(reply, content="partial")
    store.update_message(
        reply,
        content="full answer",
        status="done",
        metadata={"tokens": 3, "tok_s": 41.5, "ttft": 0.12, "prefix_hits": 32},
    )
    rows = store.messages(sid)
    assert [(m.position, m.role, m.content) for m in rows] == [
        (0, "user", "q1"),
        (1, "assistant", "a1"),
        (2, "user", "q2"),
        (3, "assistant", "full answer"),
    ]
    assert rows[-1].metadata == {"tokens": 3, "tok_s": 41.5, "ttft": 0.12, "prefix_hits": 32}
    assert rows[-1].status == "done" and rows[-1].parent_id == rows[-2].id and rows[-1].kept
    with pytest.raises(ValueError, match="role must be one of"):
        store.add_message(sid, "robot", "x")
    with pytest.raises(ValueError, match="status must be one of"):
        store.update_message(reply, status="finished")
    with pytest.raises(KeyError):
        store.add_message(12345, "user", "x")
    with pytest.raises(KeyError):
        store.update_message(12345, content="x")


def test_messages_form_a_tree_with_one_active_path(store: Store) -> None:
    sid = chat(store, "question")
    q = store.messages(sid)[0].id
    first = store.add_message(sid, "assistant", "answer A")
    second = store.add_message(sid, "assistant", "answer B", parent_id=q)  # a regenerated reply
    third = store.add_message(sid, "assistant", "answer C", parent_id=q, kept=False)
    follow = store.add_message(sid, "user", "thanks")  # after the current reply, B
    rows = store.messages(sid)
    assert [(m.id, m.parent_id, m.position, m.kept) for m in rows] == [
        (q, None, 0, True),
        (first, q, 1, False),
        (second, q, 1, True),
        (third, q, 1, False),
        (follow, second, 2, True),
    ]
    assert [m.content for m in store.active_path(sid)] == ["question", "answer B", "thanks"]
    assert store.messages(sid, active_only=True) == store.active_path(sid)
    assert [m.id for m in store.siblings(third)] == [first, second, third]
    assert [m.id for m in store.siblings(follow)] == [follow]
    store.select(first)  # the other branch: it has no follow-up
    assert [m.content for m in store.active_path(sid)] == ["question", "answer A"]
    assert store.get_session(sid).message_count == 2
    edited = store.add_message(sid, "user", "question, edited", parent_id=None)  # a fork at top
    assert [m.id for m in store.active_path(sid)] == [edited]
    store.select(q)
    assert [m.id for m in store.active_path(sid)] == [q, first]  # each fork remembers
    store.select(second)
    assert [m.id for m in store.active_path(sid)] == [q, second, follow]
    hidden = store.add_message(sid, "assistant", "not on show", parent_id=follow, kept=False)
    assert not store.messages(sid)[-1].kept and store.messages(sid)[-1].id == hidden
    assert [m.id for m in store.active_path(sid)] == [q, second, follow]  # as it was told
    with pytest.raises(NotFound, match="no message 12345 in chat"):
        store.add_message(sid, "user", "x", parent_id=12345)
    other = chat(store, "elsewhere")
    with pytest.raises(NotFound):  # a parent from another chat
        store.add_message(other, "assistant", "x", parent_id=q)
    with pytest.raises(NotFound):
        store.select(12345)


def test_deleting_a_message_removes_what_follows_it(store: Store) -> None:
    sid = chat(store, "q1", "a1", "q2", "a2")
    q1, a1, q2, a2 = store.messages(sid)
    other = store.add_message(sid, "assistant", "a1 again", parent_id=q1.id)
    store.add_message(sid, "user", "q2 on the other branch")
    store.select(a1.id)
    with pytest.raises(ValueError, match="not another version"):  # a message of another turn
        store.delete_message(a1.id, shown=q2.id)
    with pytest.raises(ValueError, match="not another version"):
        store.delete_message(a1.id, shown=a1.id)
    assert len(store.messages(sid)) == 6  # nothing was deleted
    assert store.delete_message(a1.id, shown=other) == 3  # a1, q2, a2
    assert [m.id for m in store.active_path(sid)][:2] == [q1.id, other]  # the one it was told
    assert store.search("a2") == []  # the index follows
    last = store.active_path(sid)[-1]
    assert store.delete_message(last.id, shown=None) == 1  # no version is left there
    assert [m.id for m in store.active_path(sid)] == [q1.id, other]
    assert store.clear_messages(sid) == 2 and store.messages(sid) == []
    assert store.get_session(sid) is not None
    with pytest.raises(NotFound):
        store.delete_message(a2.id, shown=None)


def test_streaming_becomes_interrupted(store: Store) -> None:
    sid = chat(store, "q")
    live = store.add_message(sid, "assistant", "half", status="streaming")
    stopped = store.add_message(sid, "assistant", "s", status="stopped")
    assert store.mark_streaming_interrupted() == 1
    statuses = {m.id: m.status for m in store.messages(sid)}
    assert statuses[live] == "interrupted" and statuses[stopped] == "stopped"
    assert store.mark_streaming_interrupted() == 0


@pytest.mark.parametrize(
    "term",
    [
        '"',
        '""',
        "'",
        "(",
        ")",
        "[x]",
        "*",
        "-",
        "-paged",
        "paged*",
        "a OR b",
        "NOT",
        "NEAR(a b)",
        "col:paged",
        "^paged",
        "+",
        "\x00",
        "  ",
        "'; DROP TABLE messages; --",
        "\\",
    ],
)
def test_search_never_raises_on_user_text(store: Store, term: str) -> None:
    chat(store, 'paged attention with [brackets] and "quotes" -dash- * star', "ok")
    assert isinstance(store.search(term), list)
    assert store.messages(1)  # nothing was dropped


fuzz = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@fuzz
@given(term=st.text(max_size=24))
def test_search_fuzz(store: Store, term: str) -> None:
    if not store.list_sessions():
        chat(store, 'some * text (with) "syntax" - NEAR OR AND')
    for hit in store.search(term):
        assert hit.session_id == 1


@fuzz
@given(
    title=st.text(max_size=20),
    contents=st.lists(st.text(max_size=40), min_size=1, max_size=4),
    metadata=st.dictionaries(
        # (chatpage's own keys must hold what it writes: store/validate.py)
        st.text(max_size=5).filter(lambda key: key not in ("label", "error")),
        st.integers() | st.floats(allow_nan=False) | st.text(max_size=5) | st.none(),
        max_size=3,
    ),
)
def test_json_round_trip_fuzz(
    store: Store, title: str, contents: list[str], metadata: dict
) -> None:
    sid = store.create_session(title, "p", {"nested": {"x": metadata}})
    top = store.add_message(sid, "user", "q")
    for text in contents:
        store.add_message(sid, "assistant", text, metadata=metadata, parent_id=top)
    exported = export_session(store, sid, "json")
    assert export_session(store, import_json(store, exported), "json") == exported
    assert [m.content for m in store.messages(sid)] == ["q", *contents]


def test_search_matches_words_literally(store: Store) -> None:
    a = chat(
        store,
        "How does paged attention work?",
        "It splits the KV cache into blocks.",
        title="paging",
    )
    b = chat(store, "Write a haiku about café mornings", "Steam rises slowly", title="poems")
    hit = store.search("paged")[0]
    assert (hit.session_id, hit.session_title, hit.role) == (a, "paging", "user")
    start, end = SNIPPET_MARKS
    assert f"{start}paged{end}" in hit.snippet
    assert [h.session_id for h in store.search("cafe")] == [b]  # diacritics folded
    assert store.search("kv blocks")[0].role == "assistant"  # every word, any order
    assert store.search("blocks kv paged") == []
    assert [h.session_id for h in store.search("[paged]")] == [a]  # brackets are not syntax
    assert [h.session_id for h in store.search('"attention"')] == [a]
    assert [h.session_id for h in store.search("hai")] == [b]  # last word is a prefix
    assert store.search("-") == [] and store.search("") == []
    message_id = store.messages(b)[1].id
    store.update_message(message_id, content="Fog lifts")  # the index follows updates
    assert store.search("steam") == [] and store.search("fog")[0].message_id == message_id


def test_injection_strings_are_stored_literally(store: Store) -> None:
    evil = "Robert'); DROP TABLE sessions; --"
    sid = store.create_session(evil, "x'); DELETE FROM messages; --", {"k": "'; --"})
    store.add_message(sid, "user", evil + ' "quoted" %s ? :name')
    assert store.get_session(sid).title == evil
    assert store.get_session(sid).persona == "x'); DELETE FROM messages; --"
    assert store.messages(sid)[0].content == evil + ' "quoted" %s ? :name'
    assert store.search("DROP TABLE")[0].session_id == sid


def test_make_title() -> None:
    assert make_title("  hello   world \n second line") == "hello world"
    assert make_title("\n\n  \nfirst real line") == "first real line"
    assert make_title("") == "New chat" and make_title(" \n ") == "New chat"
    long = make_title("Explain how the paged attention kernel handles grouped query heads")
    assert long.endswith("…") and len(long) <= 40 and long.startswith("Explain how the paged")
    assert not long[:-1].endswith(" ")
    unbroken = make_title("x" * 100)
    assert unbroken == "x" * 39 + "…"


def full_chat(store: Store) -> int:
    sid = store.create_session("Tricky «chat»", "coder", {"temperature": 0.2, "seed": 7})
    store.add_message(sid, "system", "be brief")
    question = store.add_message(sid, "user", "line 1\nline 2 ünïcödé 🙂")
    store.add_message(sid, "assistant", "A", metadata={"tokens": 1, "tok_s": 9.5})
    store.add_message(sid, "assistant", "B", status="stopped", parent_id=question)
    store.add_message(sid, "assistant", "C", status="error", parent_id=question, kept=False)
    store.add_message(sid, "user", "more")
    store.add_message(sid, "assistant", "half", status="streaming", metadata={"ttft": 0.5})
    store.set_system_prompt(sid, "Answer in French.")
    return sid


def test_export_json_round_trip_is_exact(store: Store) -> None:
    sid = full_chat(store)
    exported = export_session(store, sid, "json")
    doc = json.loads(exported)
    assert doc["format"] == "chatpage-session" and doc["version"] == 2
    assert [m["parent"] for m in doc["messages"]] == [None, 1, 2, 2, 2, 4, 6]
    assert [m["kept"] for m in doc["messages"]] == [True, True, False, True, False, True, True]
    assert doc["system_prompt"] == "Answer in French."
    new = import_json(store, exported)
    assert new != sid
    assert export_session(store, new, "json") == exported
    assert store.get_session(new).system_prompt == "Answer in French."
    original, copy = store.messages(sid), store.messages(new)
    assert [(m.position, m.role, m.content, m.status, m.metadata, m.kept) for m in original] == [
        (m.position, m.role, m.content, m.status, m.metadata, m.kept) for m in copy
    ]
    assert [m.content for m in store.active_path(new)] == [
        "be brief",
        "line 1\nline 2 ünïcödé 🙂",
        "B",
        "more",
        "half",
    ]


def test_import_reads_version_1_as_a_chain(store: Store) -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "A", "group": 1, "kept": False},
        {"role": "assistant", "content": "B", "group": 1},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "end"},
    ]
    sid = import_json(
        store,
        json.dumps(
            {
                "format": "chatpage-session",
                "version": 1,
                "title": "old",
                "persona": "p",
                "messages": messages,
            }
        ),
    )
    assert [m.content for m in store.active_path(sid)] == ["q", "B", "more", "end"]
    b = store.active_path(sid)[1]
    assert [m.content for m in store.siblings(b.id)] == ["A", "B"]


def test_export_markdown_shows_the_kept_transcript(store: Store) -> None:
    sid = full_chat(store)
    md = export_session(store, sid, "md")
    assert md.startswith("# Tricky «chat»\n")
    assert "- Persona: coder" in md and "temperature=0.2" in md
    assert "## System (this chat's own)\n\nAnswer in French.\n" in md
    assert "## User\n\nline 1\nline 2 ünïcödé 🙂\n" in md
    assert "## Assistant\n\nB\n\n*(stopped)*" in md and "1 of 3 versions" in md
    assert "\nA\n" not in md and "\nC\n" not in md
    assert "*(streaming)*" in md
    with pytest.raises(ValueError):
        export_session(store, sid, "html")  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        export_session(store, 999, "md")


def test_export_markdown_shows_a_replys_thinking_and_tool_rounds(store: Store) -> None:
    """From the metadata the recorder writes: the thought quoted, each call with its arguments
    and result in code blocks (a result holding a fence gets a longer one)."""
    reply = Entry("assistant", "It is 3.", reasoning="Add them.\nUse the tool.", reasoning_tokens=9)
    run = ToolRun("call_1", "add", '{"a": 1, "b": 2}', state="done", result="```3```")
    run.elapsed_s = 0.25
    reply.steps = [
        ToolStep("Let me add.", [run]),
        ToolStep("", [ToolRun("c2", "die", "{}", "denied")]),
    ]
    sid = store.create_session("tools", "alpha", {})
    question = store.add_message(sid, "user", "1 + 2?")
    store.add_message(
        sid, "assistant", reply.content, parent_id=question, metadata=reply_metadata(reply)
    )
    md = export_session(store, sid, "md")
    assert "## Assistant\n\n*Thought for 9 tokens:*\n\n> Add them.\n> Use the tool.\n" in md
    assert '\nLet me add.\n\n**Tool call `add`** (done, 0.25 s)\n\n```json\n{"a": 1' in md
    assert "Result:\n\n````text\n```3```\n````\n" in md
    assert "**Tool call `die`** (denied)" in md and md.endswith("\nIt is 3.\n")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("not json", "not valid JSON"),
        ("[]", "not a chatpage export"),
        ('{"format": "chatpage-session", "version": 99}', "unsupported export version"),
        (
            '{"format": "chatpage-session", "version": 2, "title": "t", "persona": "p",'
            ' "messages": [{"id": 1, "parent": 5, "role": "user", "content": "x"}]}',
            "message 1: 'parent' must be the id of an earlier message",
        ),
        (
            '{"format": "chatpage-session", "version": 1, "title": 3, "persona": "p",'
            ' "messages": []}',
            "'title' must be text",
        ),
        (
            '{"format": "chatpage-session", "version": 2, "title": "t", "persona": "p",'
            ' "system_prompt": 3, "messages": []}',
            "'system_prompt' must be text or null",
        ),
        (
            '{"format": "chatpage-session", "version": 1, "title": "t", "persona": "p",'
            ' "messages": [{"role": "robot", "content": "x"}]}',
            "message 1: role must be one of",
        ),
        (
            '{"format": "chatpage-session", "version": 1, "title": "t", "persona": "p",'
            ' "messages": [{"role": "user", "content": "x", "metadata": []}]}',
            "'metadata' must be an object",
        ),
    ],
)
def test_import_rejects_bad_input_atomically(store: Store, text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        import_json(store, text)
    assert store.list_sessions() == []


def test_import_minimal(store: Store) -> None:
    sid = import_json(
        store,
        '{"format": "chatpage-session", "version": 1, "title": "t", '
        '"persona": "p", "messages": [{"role": "user", "content": "x"}]}',
    )
    (msg,) = store.messages(sid)
    assert (msg.content, msg.status, msg.kept, msg.metadata) == ("x", "done", True, {})


def test_migrates_an_empty_v0_database(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    sqlite3.connect(path).close()  # exists, version 0, no tables
    with Store.open(path) as opened:
        assert opened.persistent and opened.notice is None
        chat(opened, "hello")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"sessions", "messages", "messages_fts"} <= tables
    assert migrate(conn) == SCHEMA_VERSION  # already current: nothing to do
    with Store.open(path) as reopened:  # data survives a reopen
        assert [m.content for m in reopened.messages(1)] == ["hello"]


def test_newer_schema_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with Store.open(path) as opened:
        assert not opened.persistent and "upgrade chatpage" in opened.notice
    assert path.exists() and not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.parametrize(
    "garbage", [b"this is not a database at all" * 200, b"SQLite format 3\x00" + b"\xff" * 5000]
)
def test_corrupt_file_is_moved_aside(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / DB_NAME
    path.write_bytes(garbage)
    (tmp_path / (DB_NAME + "-wal")).write_bytes(b"stale")  # must not leak into the new db
    with Store.open(path) as opened:
        assert opened.persistent
        (moved,) = tmp_path.glob(DB_NAME + ".corrupt-*[0-9]")
        assert moved.read_bytes() == garbage
        assert opened.notice is not None and "\n" not in opened.notice
        assert str(moved) in opened.notice
        chat(opened, "fresh start")
    with Store.open(path) as reopened:
        assert reopened.notice is None and len(reopened.list_sessions()) == 1


def test_unusable_data_dir_falls_back_to_memory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a regular file where the data dir should be")
    with Store.open(blocker / "chatpage" / DB_NAME) as opened:
        assert not opened.persistent
        assert opened.notice.startswith("chatpage is running without saving chats")
        assert str(blocker / "chatpage" / DB_NAME) in opened.notice and "\n" not in opened.notice
        sid = chat(opened, "still works in memory")  # the app keeps working
        assert opened.search("memory")[0].session_id == sid
    assert blocker.read_text().startswith("a regular file")


def test_read_only_dir_or_file_falls_back_to_memory(tmp_path: Path, monkeypatch) -> None:
    data = tmp_path / "data"
    path = data / DB_NAME
    with Store.open(path) as first:
        chat(first, "saved before")
    data.chmod(0o500)
    path.chmod(0o400)
    # Running as root ignores these modes, so also open the file the way SQLite does for a
    # read-only file (mode=ro): real SQLite then refuses every write.
    real_connect = store_schema.connect
    monkeypatch.setattr(
        store_schema,
        "connect",
        lambda target: (
            real_connect(target)
            if target == ":memory:"
            else sqlite3.connect(f"file:{target}?mode=ro", uri=True, isolation_level=None)
        ),
    )
    try:
        with Store.open(path) as opened:
            assert not opened.persistent
            assert "running without saving" in opened.notice and str(path) in opened.notice
            assert opened.list_sessions() == []  # in memory, empty
            chat(opened, "not saved")
    finally:
        data.chmod(0o700)
        path.chmod(0o600)
        monkeypatch.undo()
    assert not list(data.glob("*.corrupt-*"))  # an unwritable file is not treated as corrupt
    with Store.open(path) as reopened:
        assert [s.message_count for s in reopened.list_sessions()] == [1]


def test_unreadable_file_is_moved_aside(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / DB_NAME
    path.write_bytes(b"someone else's bytes")
    # Root reads any file, so stand in for a non-root user: the file reports unreadable and
    # the first connection gets SQLite's real "unable to open" (a directory cannot be opened).
    real_connect = store_schema.connect
    targets: list[object] = []

    def connect(target):
        targets.append(target)
        return real_connect(tmp_path if len(targets) == 1 else target)

    monkeypatch.setattr(store_schema, "connect", connect)
    monkeypatch.setattr(store_schema, "_unreadable", lambda p: p == path and len(targets) == 1)
    with Store.open(path) as opened:
        assert opened.persistent and "could not be read" in opened.notice
        (moved,) = tmp_path.glob(DB_NAME + ".corrupt-*")
        assert moved.read_bytes() == b"someone else's bytes"
        chat(opened, "fresh")


def test_closed_chats(store: Store) -> None:
    a = chat(store, "q1", "a1", "q2", "a2")
    b = chat(store, "other")
    store.set_closed(a, True)
    assert [s.id for s in store.list_sessions(closed=False)] == [b]
    assert [s.id for s in store.list_sessions(closed=True)] == [a]
    assert store.get_session(a).closed and len(store.list_sessions()) == 2
    store.set_closed(a, False)
    assert not store.get_session(a).closed
    with pytest.raises(KeyError):
        store.set_closed(999, True)


def test_insert_session_is_all_or_nothing(store: Store) -> None:
    from chatpage.store import NewMessage

    with pytest.raises(ValueError, match="message 2: status must be one of"):
        store.insert_session(
            "t", "p", {}, [NewMessage("user", "x"), NewMessage("assistant", "y", status="bogus")]
        )
    assert store.list_sessions() == []
    with pytest.raises(ValueError, match="message 1: parent must be an earlier message"):
        store.insert_session("t", "p", {}, [NewMessage("user", "x", parent=0)])
    assert store.list_sessions() == []
    sid = store.insert_session(
        "t",
        "p",
        {"seed": 1},
        [
            NewMessage("user", "q"),
            NewMessage("assistant", "a", parent=0, kept=False),
            NewMessage("assistant", "b", parent=0),
            NewMessage("user", "more", parent=2),
        ],
        created_at="2024-01-02T03:04:05+00:00",
    )
    rows = store.messages(sid)
    assert [(m.position, m.content, m.kept) for m in rows] == [
        (0, "q", True),
        (1, "a", False),
        (1, "b", True),
        (2, "more", True),
    ]
    assert rows[1].parent_id == rows[2].parent_id == rows[0].id
    assert store.get_session(sid).created_at == "2024-01-02T03:04:05+00:00"


def test_migrates_a_v1_database_with_chats(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    conn = sqlite3.connect(path, isolation_level=None)
    store_schema.MIGRATIONS[0](conn)  # the schema as chatpage 1 left it
    conn.execute("PRAGMA user_version = 1")
    conn.execute(
        "INSERT INTO sessions (title, persona, created_at, updated_at) "
        "VALUES ('old chat', 'assistant', '2024-01-01', '2024-01-01')"
    )
    for position, role, content, group, kept in [
        (0, "user", "q", None, 1),
        (1, "assistant", "A", 2, 0),
        (1, "assistant", "B", 2, 1),
        (2, "user", "more", None, 1),
        (3, "assistant", "end", None, 1),
    ]:
        conn.execute(
            "INSERT INTO messages (session_id, position, role, content, group_id, kept,"
            " created_at) VALUES (1, ?, ?, ?, ?, ?, '2024-01-01')",
            (position, role, content, group, kept),
        )
    conn.close()
    with Store.open(path) as opened:
        (row,) = opened.list_sessions(closed=False)
        assert (row.title, row.closed, row.draft, row.message_count) == ("old chat", False, "", 4)
        path_rows = opened.active_path(row.id)
        assert [m.content for m in path_rows] == ["q", "B", "more", "end"]  # a chain
        assert [m.content for m in opened.siblings(path_rows[1].id)] == ["A", "B"]
        assert opened.search("end")[0].message_id == path_rows[-1].id
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_in_memory_store_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with Store.open(blocker / DB_NAME) as opened:
        assert opened.fault.startswith(f"cannot use {blocker / DB_NAME} (")
        assert opened.fault in opened.notice
    with Store.open(tmp_path / DB_NAME) as fine:
        assert fine.fault is None


def test_drafts_are_kept_per_chat(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    with Store.open(path) as opened:
        a, b = chat(opened, "q"), chat(opened, "r")
        assert opened.draft(a) == ""
        before = [s.id for s in opened.list_sessions()]
        opened.set_draft(a, "half a thought\nsecond line")
        opened.set_draft(b, "other")
        assert [s.id for s in opened.list_sessions()] == before  # a draft does not reorder
        with pytest.raises(NotFound, match="no chat with id 999"):
            opened.set_draft(999, "x")
        with pytest.raises(KeyError):  # NotFound is a KeyError
            opened.draft(999)
    with Store.open(path) as reopened:  # drafts survive a restart
        assert reopened.draft(a) == "half a thought\nsecond line"
        assert reopened.get_session(b).draft == "other"
        reopened.set_draft(b, "")
        assert reopened.draft(b) == ""


def test_a_chats_own_system_prompt_is_kept(tmp_path: Path) -> None:
    path = tmp_path / DB_NAME
    with Store.open(path) as opened:
        a, b = chat(opened, "q"), chat(opened, "r")
        before = [s.id for s in opened.list_sessions()]
        opened.set_system_prompt(a, "You are terse.")
        assert [s.id for s in opened.list_sessions()] == before  # it does not reorder
        with pytest.raises(NotFound, match="no chat with id 999"):
            opened.set_system_prompt(999, "x")
    with Store.open(path) as reopened:
        assert reopened.get_session(a).system_prompt == "You are terse."
        assert reopened.get_session(b).system_prompt is None  # the persona's
        reopened.set_system_prompt(a, None)
        assert reopened.get_session(a).system_prompt is None
