"""The Recorder and restore without Textual: Chats over a fake client, a real Store, a fake clock."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers import PERSONA, FakeClient, done, event, facts, stopped

from chatpage.chat import recorder as persistence
from chatpage.chat.chats import Chats
from chatpage.chat.entry import Attachment
from chatpage.chat.recorder import Recorder
from chatpage.chat.sampling import AltMode
from chatpage.chat.saved import restore
from chatpage.config.personas import Persona
from chatpage.engine.client import FinishReason
from chatpage.store import Store

OTHER = Persona("other", "another persona", "You are other.", temperature=0.1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig(tmp_path):
    """(chats, client, store, recorder, clock, problems) with the recorder observing all."""
    store = Store.open(tmp_path / "chats.db")
    clock = Clock()
    problems: list[str] = []
    recorder = Recorder(store, problems.append, clock)
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    chats.observers.append(recorder)
    yield chats, client, store, recorder, clock, problems
    store.close()


def saved(store: Store, chat: int, active_only: bool = True) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in store.messages(chat, active_only=active_only)]


def test_a_turn_is_saved_as_it_streams(rig):
    chats, _client, store, recorder, clock, problems = rig
    session = chats.open(PERSONA)
    assert store.list_sessions() == []  # an empty chat is not saved
    chats.send(session, "  How does paging work?\nThe second line is not in the title")
    chat = session.store_id
    row = store.get_session(chat)
    assert (row.title, row.persona) == ("How does paging work?", "p")
    assert row.settings == {
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 0,
        "max_tokens": 8,
        "seed": None,
    }
    assert saved(store, chat) == [
        ("user", "How does paging work?\nThe second line is not in the title", "done"),
        ("assistant", "", "streaming"),
    ]

    clock.now += 1.0
    chats.requests.apply(event("r1", "It"))  # too soon after the last write: kept for later
    assert saved(store, chat)[-1] == ("assistant", "", "streaming")
    clock.now += 1.5
    chats.requests.apply(event("r1", " splits"))  # 2.5 s since the last write
    assert saved(store, chat)[-1] == ("assistant", "It splits", "streaming")
    clock.now += 0.5
    chats.requests.apply(event("r1", " the cache"))
    recorder.flush()  # not due yet
    assert saved(store, chat)[-1][1] == "It splits"
    clock.now += 1.6
    recorder.flush()  # the app's timer: due now, though no event came
    assert saved(store, chat)[-1] == ("assistant", "It splits the cache", "streaming")

    chats.requests.apply(event("r1", " into blocks.", finished=True, reason=FinishReason.STOP))
    (reply,) = [m for m in store.messages(chat) if m.role == "assistant"]
    assert (reply.content, reply.status) == ("It splits the cache into blocks.", "done")
    assert reply.metadata == {
        "tokens": 32,
        "prompt_tokens": 20,
        "prefix_hit_tokens": 16,
        "ttft_s": 0.1,
        "elapsed_s": 0.5,
    }
    assert session.entries[-1].store_id == reply.id

    chats.send(session, "And then?")
    chats.requests.apply(event("r2", "Then"))
    assert chats.requests.stop(session)
    chats.requests.apply(stopped("r2"))
    assert saved(store, chat)[-1] == ("assistant", "Then", "stopped")
    assert problems == []


def test_title_settings_attachments_and_restore(rig):
    chats, _client, store, _recorder, _clock, problems = rig
    session = chats.open(PERSONA)
    chats.attach(session, Attachment("notes.txt", "line one\nline two"))
    chats.send(session, "")  # an attachment alone is a message
    assert session.title == "notes.txt"
    chats.requests.apply(event("r1", "Read it.", finished=True, reason=FinishReason.STOP))
    chats.rename(session, "My notes")
    chats.set_setting(session, "temperature", "0.9")
    chats.set_setting(session, "seed", "7")
    row = store.get_session(session.store_id)
    assert row.title == "My notes"
    assert (row.settings["temperature"], row.settings["seed"]) == (0.9, 7)

    (back,), notes = restore(store, [OTHER, PERSONA], OTHER, first_id=5)
    assert notes == [] and back.id == 5 and back.store_id == session.store_id
    assert (back.title, back.persona, back.sampling) == ("My notes", PERSONA, session.sampling)
    assert facts(back.entries) == facts(session.entries)  # content, status, attachments, ...
    assert back.history == []  # nothing was typed (the message was the file)
    assert back.conversation() == session.conversation()  # continuing sends the same history

    (gone,), notes = restore(store, [OTHER], OTHER, first_id=1)
    assert gone.persona is OTHER and "'p', which is gone" in notes[0]
    assert problems == []


def test_a_first_draft_or_own_system_prompt_saves_an_empty_chat(rig):
    chats, _client, store, recorder, _clock, problems = rig
    drafted, prompted = chats.open(PERSONA), chats.open(PERSONA)
    recorder.keep_draft(drafted)  # nothing typed: nothing to keep
    recorder.keep_system_prompt(drafted, own=False)
    assert store.list_sessions() == [] and drafted.store_id is None

    drafted.draft = "half a thought"
    recorder.keep_draft(drafted)
    prompted.persona = replace(PERSONA, system_prompt="You are terse.")
    recorder.keep_system_prompt(prompted, own=True)
    rows = {r.id: r for r in store.list_sessions()}
    assert (rows[drafted.store_id].draft, rows[drafted.store_id].system_prompt) == (
        "half a thought",
        None,
    )
    assert rows[prompted.store_id].system_prompt == "You are terse."

    restored = {s.store_id: s for s in restore(store, [PERSONA], OTHER, first_id=1)[0]}
    assert restored[prompted.store_id].persona == replace(PERSONA, system_prompt="You are terse.")
    assert restored[prompted.store_id].for_model()[0]["content"] == "You are terse."
    assert restored[drafted.store_id].persona == PERSONA

    prompted.draft = "typed"  # a draft emptied again: the chat keeps its own prompt
    recorder.keep_draft(prompted)
    prompted.draft = ""
    recorder.keep_draft(prompted)
    assert store.get_session(prompted.store_id).draft == ""
    drafted.draft = ""  # ...but one with nothing else to keep is removed
    recorder.keep_draft(drafted)
    assert drafted.store_id is None
    assert [r.id for r in store.list_sessions()] == [prompted.store_id]

    recorder.keep_system_prompt(prompted, own=False)  # a persona switch: the persona's again
    assert store.get_session(prompted.store_id).system_prompt is None
    chats.send(drafted, "hello")  # its first message saves it as before
    assert store.get_session(drafted.store_id).draft == ""
    assert problems == []


def test_an_emptied_draft_never_deletes_a_chat_another_chatpage_filled(tmp_path):
    """Two chatpages on one database both show a draft-only chat; B sends in it, then A, whose
    view is still empty, empties its draft: the chat and B's message stay."""
    path = tmp_path / "chats.db"
    with Store.open(path) as first:
        drafted = Chats(FakeClient(), lambda e: None).open(PERSONA)
        drafted.draft = "half a thought"
        Recorder(first).keep_draft(drafted)
    windows = []
    for _ in range(2):
        store = Store.open(path)
        problems: list[str] = []
        chats = Chats(FakeClient(), lambda e: None)
        chats.observers.append(recorder := Recorder(store, problems.append))
        (session,), _ = restore(store, [PERSONA], PERSONA, first_id=1)
        windows.append((store, chats, chats.adopt(session), recorder, problems))
    (
        (store_a, _chats, view_a, recorder_a, problems_a),
        (store_b, chats_b, view_b, _rec, problems_b),
    ) = windows
    try:
        chats_b.send(view_b, "sent from B")
        view_a.draft = ""
        recorder_a.keep_draft(view_a)
        assert view_a.store_id == view_b.store_id  # A keeps saving into the chat it shares
        assert saved(store_a, view_b.store_id) == [
            ("user", "sent from B", "done"),
            ("assistant", "", "streaming"),
        ]
        assert store_a.get_session(view_b.store_id).draft == ""
        assert problems_a == problems_b == []
    finally:
        store_a.close()
        store_b.close()


def test_alternatives_are_saved_as_versions_of_the_reply(rig):
    chats, _client, store, _recorder, _clock, _problems = rig
    session = chats.open(PERSONA)
    chats.send(session, "Write a haiku")
    chats.requests.apply(done("r1", "first"))
    chats.set_alt_mode(session, AltMode("samples", 3))
    chats.regenerate(session)
    for i in range(3):
        chats.requests.apply(
            event("r2", f"alt {i}", index=i, reason=FinishReason.LENGTH, finished=i == 2)
        )
    kept = chats.requests.keep(session, 2)
    rows = store.messages(session.store_id)
    question = rows[0].id
    assert [(m.content, m.parent_id, m.kept, m.metadata.get("label")) for m in rows[1:]] == [
        ("first", question, False, None),
        ("alt 0", question, False, "sample 1"),
        ("alt 1", question, True, "sample 2"),
        ("alt 2", question, False, "sample 3"),
    ]
    assert kept.store_id == rows[3].id

    (back,), _ = restore(store, [PERSONA], PERSONA, first_id=1)
    assert facts(back.entries[-1:]) == facts([kept]) and back.entries[-1].store_id == kept.store_id
    assert back.entries[-1].label == "sample 2"
    assert [v.content for v in back.entries[0].replies.versions] == [
        "first",
        "alt 0",
        "alt 1",
        "alt 2",
    ]

    chats.send(session, "Another")  # goes on under the kept reply
    assert saved(store, session.store_id)[-2:] == [
        ("user", "Another", "done"),
        ("assistant", "", "streaming"),
    ]


def test_forks_switches_and_continues_are_saved_and_restored(rig):
    chats, _client, store, _recorder, _clock, problems = rig
    session = chats.open(PERSONA)
    for n, question in enumerate(("one", "two"), 1):
        chats.send(session, question)
        chats.requests.apply(done(f"r{n}", f"re: {question}"))
    chats.edit(session, session.entries[0])
    chats.send(session, "one, again")
    chats.requests.apply(done("r3", "re: again"))
    chats.regenerate(session)
    chats.requests.apply(event("r4", "third"))
    chats.requests.stop(session)
    chats.requests.apply(stopped("r4"))
    chats.continue_reply(session)
    chats.requests.apply(done("r5", " try"))
    assert saved(store, session.store_id) == [
        ("user", "one, again", "done"),
        ("assistant", "third try", "done"),
    ]
    chats.switch(session, session.entries[0], -1)  # back to the first version of the chat
    assert saved(store, session.store_id) == [
        ("user", "one", "done"),
        ("assistant", "re: one", "done"),
        ("user", "two", "done"),
        ("assistant", "re: two", "done"),
    ]

    (back,), _ = restore(store, [PERSONA], PERSONA, first_id=1)
    assert [e.content for e in back.entries] == ["one", "re: one", "two", "re: two"]
    top = back.entries[0].place()
    assert (top.number, top.count) == (1, 2)
    back.transcript.switch(back.entries[0], 1)
    assert [e.content for e in back.entries] == ["one, again", "third try"]
    assert back.entries[1].place().label() == "◀ 2/2 ▶"
    assert back.history == ["one", "two", "one, again"]  # typed prompts, oldest first

    chats.delete(session, session.entries[2])  # "two" and its reply leave the store
    assert saved(store, session.store_id) == [
        ("user", "one", "done"),
        ("assistant", "re: one", "done"),
    ]
    assert problems == []


def test_clear_close_finish_and_delete(rig):
    chats, _client, store, recorder, clock, _problems = rig
    session = chats.open(PERSONA)
    chats.send(session, "one")
    chats.requests.apply(done("r1", "reply one"))
    chats.regenerate(session)
    assert saved(store, session.store_id)[-1] == ("assistant", "", "streaming")
    clock.now += 5
    chats.requests.apply(event("r2", "again"))
    chats.close(session)  # closing stops the reply; the chat stays saved, marked closed
    assert saved(store, session.store_id)[-1] == ("assistant", "again", "stopped")
    assert store.get_session(session.store_id).closed
    assert restore(store, [PERSONA], PERSONA, 1)[0] == []  # a closed chat is not reopened

    other = chats.open(PERSONA)
    chats.send(other, "cut off by quitting")
    clock.now += 0.5
    chats.requests.apply(event("r3", "half"))
    recorder.finish()
    assert saved(store, other.store_id)[-1] == ("assistant", "half", "interrupted")

    chats.clear(other)
    assert saved(store, other.store_id, active_only=False) == []
    chat = other.store_id
    chats.send(other, "after clearing")
    recorder.delete(other)
    assert store.get_session(chat) is None and other.store_id is None
    chats.close(other)  # nothing left to save: no error
    assert store.list_sessions() == [store.get_session(session.store_id)]


def test_a_crash_leaves_streaming_replies_interrupted(rig, monkeypatch):
    chats, _client, store, _recorder, clock, _problems = rig
    session = chats.open(PERSONA)
    chats.send(session, "q")
    monkeypatch.setattr(persistence, "SAVE_INTERVAL_S", 0.0)
    chats.requests.apply(event("r1", "partial answer"))
    # no finish(): the process died here
    (back,), _ = restore(store, [PERSONA], PERSONA, 1)
    assert [(e.content, e.status) for e in back.entries] == [
        ("q", "done"),
        ("partial answer", "interrupted"),
    ]
    assert saved(store, session.store_id)[-1][2] == "interrupted"


def test_write_failures_are_reported_once_and_the_session_goes_on(rig):
    chats, _client, store, _recorder, _clock, problems = rig
    session = chats.open(PERSONA)
    store.close()
    chats.send(session, "hello")
    chats.rename(session, "x")
    assert len(problems) == 1 and problems[0].startswith("could not save the chat:")
    assert session.entries[0].content == "hello" and session.streaming
