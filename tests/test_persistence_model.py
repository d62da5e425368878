"""The Recorder and restore without Textual: Chats over a fake client, a real Store, a fake clock."""

from __future__ import annotations

import pytest
from test_ui_model import PERSONA, FakeClient, event

from chatpage.chat.chats import Chats
from chatpage.chat.recorder import Recorder, restore
from chatpage.chat.session import AltMode, Attachment
from chatpage.config.personas import Persona
from chatpage.engine.client import StreamEvent
from chatpage.store import Store
from chatpage.chat import recorder as persistence

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


def saved(store: Store, chat: int, kept_only: bool = True) -> list[tuple[str, str, str]]:
    return [(m.role, m.content, m.status) for m in store.messages(chat, kept_only=kept_only)]


def stopped(rid: str, text: str) -> StreamEvent:
    return StreamEvent(
        request_id=rid, index=0, text=text, delta="", replaced=False, num_tokens=0, finished=True,
        finish_reason="abort", cumulative_logprob=0.0, score=None, request_finished=True,
        prompt_tokens=0, prefix_hit_tokens=0, ttft_s=None, elapsed_s=1.0)


def test_a_turn_is_saved_as_it_streams(rig):
    chats, _client, store, recorder, clock, problems = rig
    session = chats.open(PERSONA)
    assert store.list_sessions() == []  # an empty chat is not saved
    chats.send(session, "  How does paging work?\nThe second line is not in the title")
    chat = session.store_id
    row = store.get_session(chat)
    assert (row.title, row.persona) == ("How does paging work?", "p")
    assert row.settings == {"temperature": 0.5, "top_p": 1.0, "top_k": 0, "max_tokens": 8,
                            "seed": None}
    assert saved(store, chat) == [("user", "How does paging work?\nThe second line is not in "
                                   "the title", "done"), ("assistant", "", "streaming")]

    clock.now += 1.0
    chats.apply(event("r1", "It"))  # too soon after the last write: kept for later
    assert saved(store, chat)[-1] == ("assistant", "", "streaming")
    clock.now += 1.5
    chats.apply(event("r1", "It splits"))  # 2.5 s since the last write
    assert saved(store, chat)[-1] == ("assistant", "It splits", "streaming")
    clock.now += 0.5
    chats.apply(event("r1", "It splits the cache"))
    recorder.flush()  # not due yet
    assert saved(store, chat)[-1][1] == "It splits"
    clock.now += 1.6
    recorder.flush()  # the app's timer: due now, though no event came
    assert saved(store, chat)[-1] == ("assistant", "It splits the cache", "streaming")

    chats.apply(event("r1", "It splits the cache into blocks.", finished=True, reason="stop"))
    (reply,) = [m for m in store.messages(chat) if m.role == "assistant"]
    assert (reply.content, reply.status) == ("It splits the cache into blocks.", "done")
    assert reply.metadata == {"tokens": 32, "prompt_tokens": 20, "prefix_hit_tokens": 16,
                              "ttft_s": 0.1, "elapsed_s": 0.5}
    assert session.entries[-1].store_id == reply.id

    chats.send(session, "And then?")
    chats.apply(event("r2", "Then"))
    assert chats.stop(session)
    chats.apply(stopped("r2", "Then"))
    assert saved(store, chat)[-1] == ("assistant", "Then", "stopped")
    assert problems == []


def test_title_settings_attachments_and_restore(rig):
    chats, _client, store, _recorder, _clock, problems = rig
    session = chats.open(PERSONA)
    chats.attach(session, Attachment("notes.txt", "line one\nline two"))
    chats.send(session, "")  # an attachment alone is a message
    assert session.title == "notes.txt"
    chats.apply(event("r1", "Read it.", finished=True, reason="stop"))
    chats.rename(session, "My notes")
    chats.set_setting(session, "temperature", "0.9")
    chats.set_setting(session, "seed", "7")
    row = store.get_session(session.store_id)
    assert row.title == "My notes"
    assert (row.settings["temperature"], row.settings["seed"]) == (0.9, 7)

    (back,), notes = restore(store, [OTHER, PERSONA], OTHER, first_id=5)
    assert notes == [] and back.id == 5 and back.store_id == session.store_id
    assert (back.title, back.persona, back.sampling) == ("My notes", PERSONA, session.sampling)
    assert back.entries == session.entries  # content, status, attachments, stats, label
    assert back.history == []  # nothing was typed (the message was the file)
    assert back.conversation() == session.conversation()  # continuing sends the same history

    (gone,), notes = restore(store, [OTHER], OTHER, first_id=1)
    assert gone.persona is OTHER and "'p', which is gone" in notes[0]
    assert problems == []


def test_alternatives_are_saved_as_siblings_with_the_kept_one(rig):
    chats, _client, store, _recorder, _clock, _problems = rig
    session = chats.open(PERSONA)
    chats.send(session, "Write a haiku")
    chats.apply(event("r1", "first", finished=True, reason="stop"))
    chats.set_alt_mode(session, AltMode("samples", 3))
    chats.regenerate(session)
    for i in range(3):
        chats.apply(event("r2", f"alt {i}", index=i, finished=True, reason="length",
                          request_finished=i == 2))
    kept = chats.keep(session, 2)
    rows = store.messages(session.store_id)
    assert [(m.content, m.kept, m.metadata["label"]) for m in rows if m.role == "assistant"] == [
        ("alt 1", True, "sample 2"), ("alt 0", False, "sample 1"), ("alt 2", False, "sample 3")]
    assert len({m.group_id for m in rows if m.role == "assistant"}) == 1
    assert "first" not in [m.content for m in rows]  # the regenerated reply was dropped
    assert kept.store_id == rows[1].id

    (back,), _ = restore(store, [PERSONA], PERSONA, first_id=1)
    assert back.entries[-1] == kept and back.entries[-1].label == "sample 2"

    chats.send(session, "Another")  # positions continue after the group
    assert saved(store, session.store_id)[-2:] == [("user", "Another", "done"),
                                                   ("assistant", "", "streaming")]


def test_dropped_ends_close_finish_and_delete(rig):
    chats, _client, store, recorder, clock, _problems = rig
    session = chats.open(PERSONA)
    chats.send(session, "one")
    chats.apply(event("r1", "reply one", finished=True, reason="stop"))
    chats.send(session, "two")
    chats.apply(event("r2", "reply two", finished=True, reason="stop"))
    assert chats.edit_last(session) == "two"  # the last exchange leaves the store too
    assert saved(store, session.store_id) == [("user", "one", "done"),
                                              ("assistant", "reply one", "done")]
    chats.regenerate(session)
    assert saved(store, session.store_id)[-1] == ("assistant", "", "streaming")
    clock.now += 5
    chats.apply(event("r3", "again"))
    chats.close(session)  # closing stops the reply; the chat stays saved, marked closed
    assert saved(store, session.store_id)[-1] == ("assistant", "again", "stopped")
    assert store.get_session(session.store_id).closed
    assert restore(store, [PERSONA], PERSONA, 1)[0] == []  # a closed chat is not reopened

    other = chats.open(PERSONA)
    chats.send(other, "cut off by quitting")
    clock.now += 0.5
    chats.apply(event("r4", "half"))
    recorder.finish()
    assert saved(store, other.store_id)[-1] == ("assistant", "half", "interrupted")

    chats.clear(other)
    assert saved(store, other.store_id) == []
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
    chats.apply(event("r1", "partial answer"))
    # no finish(): the process died here
    (back,), _ = restore(store, [PERSONA], PERSONA, 1)
    assert [(e.content, e.status) for e in back.entries] == [("q", "done"),
                                                            ("partial answer", "interrupted")]
    assert saved(store, session.store_id)[-1][2] == "interrupted"


def test_write_failures_are_reported_once_and_the_session_goes_on(rig):
    chats, _client, store, _recorder, _clock, problems = rig
    session = chats.open(PERSONA)
    store.close()
    chats.send(session, "hello")
    chats.rename(session, "x")
    assert len(problems) == 1 and problems[0].startswith("could not save the chat:")
    assert session.entries[0].content == "hello" and session.streaming
