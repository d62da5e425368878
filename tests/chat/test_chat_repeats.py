"""Messages that repeat ("yes", then "yes" again; a reply that comes out the same twice) are
distinct messages: over the real engine (tiny random Llama) and a real store, each is sent with
everything before it, and regenerating, editing, switching and deleting act on the one asked
for, in memory and in the store, and after a restart."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest
from helpers import facts, settle

from chatpage.chat.chats import Chats
from chatpage.chat.entry import Entry, Place
from chatpage.chat.recorder import Recorder
from chatpage.chat.saved import restore
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.engine.client import LocalEngineClient
from chatpage.engine.text.chat_template import continue_prompt, render_prompt
from chatpage.store import NewMessage, Store

PERSONA = Persona(
    "tiny", "a test persona", "You are tiny. Answer briefly.", temperature=0.0, max_tokens=4
)


class Rig:
    """Chats over the engine, saved by a recorder into a store at `path`; `restart` reopens
    the store and brings the open chats back, as the app does at start."""

    def __init__(self, client: LocalEngineClient, path: Path) -> None:
        self.client, self.path = client, path
        self.problems: list[str] = []
        self._open()

    def _open(self) -> None:
        self.events: queue.Queue = queue.Queue()
        self.store = Store.open(self.path)
        self.chats = Chats(self.client, self.events.put)
        self.chats.observers.append(Recorder(self.store, self.problems.append))

    def say(self, session: ChatSession, text: str) -> Entry:
        """Send `text` and wait for the reply; returns the reply."""
        self.chats.send(session, text)
        self.settle(session)
        return session.entries[-1]

    def settle(self, session: ChatSession) -> None:
        settle(self.chats, self.events, session)

    def restart(self) -> list[ChatSession]:
        self.store.close()
        self._open()
        sessions, _notes = restore(self.store, [PERSONA], PERSONA, 1)
        return [self.chats.adopt(s) for s in sessions]

    def tokens(self, texts: list[str]) -> int:
        """The prompt the engine sees for the system prompt and `texts` (user first)."""
        return len(render_prompt(self.client.engine.tokenizer, dialogue(texts)))


def dialogue(texts: list[str]) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": "system", "content": PERSONA.system_prompt}] + [
        {"role": roles[i % 2], "content": text} for i, text in enumerate(texts)
    ]


def ids(entries: list[Entry]) -> list[int | None]:
    return [e.store_id for e in entries]


@pytest.fixture
def rig(tiny_client, tmp_path):
    rig = Rig(tiny_client, tmp_path / "chats.db")
    yield rig
    rig.store.close()
    assert rig.problems == []


def test_a_repeated_message_is_sent_with_everything_before_it(rig):
    chats = rig.chats
    session = chats.open(PERSONA)
    first = rig.say(session, "yes")
    second = rig.say(session, "tell me more")
    third = rig.say(session, "yes")
    asked = ["yes", first.content, "tell me more", second.content, "yes"]
    assert third.stats.prompt_tokens == rig.tokens(asked)  # not the system prompt and "yes"

    chats.regenerate(session, third)  # greedy: the same reply again, another version of it
    rig.settle(session)
    again = session.entries[-1]
    assert again is not third and again.content == third.content
    assert again.stats.prompt_tokens == rig.tokens(asked)
    assert (third.place(), again.place()) == (Place(1, 2), Place(2, 2))
    assert chats.switch(session, again, -1) is third and session.entries[-1] is third

    before = session.entries
    [restored] = rig.restart()
    assert facts(restored.entries) == facts(before) and ids(restored.entries) == ids(before)
    assert [e.place() for e in restored.entries] == [e.place() for e in before]
    reply = rig.say(restored, "yes")
    assert reply.stats.prompt_tokens == rig.tokens(asked + [third.content, "yes"])


def test_an_edit_to_the_same_text_is_a_version_of_its_own(rig):
    chats = rig.chats
    session = chats.open(PERSONA)
    first = rig.say(session, "yes")
    rig.say(session, "yes")  # the same message twice in a row
    original = session.entries[2]
    versions = [original]
    for number in (2, 3):
        chats.edit(session, versions[-1])
        reply = rig.say(session, "yes")
        versions.append(session.entries[2])
        assert versions[-1] is not versions[-2] and versions[-1].place() == Place(number, number)
        assert reply.stats.prompt_tokens == rig.tokens(["yes", first.content, "yes"])
    v1, v2, v3 = versions

    assert chats.switch(session, v3, -1) is v2 and v2.place() == Place(2, 3)
    assert chats.switch(session, v2, 1) is v3
    chats.switch(session, v3, -1)
    chats.delete(session, v2)  # on show: the newest other version takes its place
    fork = session.transcript.fork_of(v1)
    assert fork.versions == [v1, v3] and session.entries[2] is v3
    assert (v1.place(), v3.place()) == (Place(1, 2), Place(2, 2))
    saved = rig.store.siblings(v1.store_id)
    assert [(m.id, m.kept) for m in saved] == [(v1.store_id, False), (v3.store_id, True)]

    before = session.entries
    [restored] = rig.restart()
    assert facts(restored.entries) == facts(before) and ids(restored.entries) == ids(before)
    assert ids(restored.transcript.fork_of(restored.entries[2]).versions) == ids([v1, v3])


def test_a_reply_that_fails_the_same_way_twice_is_two_versions(rig):
    chats = rig.chats
    session = chats.open(PERSONA)
    failed = rig.say(session, " ".join(["paging"] * 1500))  # longer than the context window
    assert failed.status == "error" and "context window" in failed.error
    chats.regenerate(session, failed)
    rig.settle(session)
    again = session.entries[-1]
    assert again is not failed and facts([again]) == facts([failed])  # twins
    assert (failed.place(), again.place()) == (Place(1, 2), Place(2, 2))
    assert chats.switch(session, again, -1) is failed
    assert chats.switch(session, failed, 1) is again

    chats.delete(session, failed)
    assert session.entries[-1] is again and again.place() == Place(1, 1)
    assert [m.id for m in rig.store.siblings(again.store_id)] == [again.store_id]
    [restored] = rig.restart()
    assert ids(restored.entries) == ids(session.entries)
    assert restored.entries[-1].place() == Place(1, 1)


def test_a_saved_chat_with_repeated_replies_continues_the_right_one(rig):
    """A chat saved without reply stats (an import), where the same reply ends two turns and
    is also a version of itself."""
    chat = rig.store.insert_session(
        "imported",
        PERSONA.name,
        {},
        [
            NewMessage("user", "yes"),
            NewMessage("assistant", "Sure.", parent=0),
            NewMessage("user", "tell me more", parent=1),
            NewMessage("assistant", "Sure.", parent=2, kept=False),
            NewMessage("assistant", "Sure.", parent=2),
        ],
    )
    [session] = rig.restart()
    assert session.store_id == chat
    tip, twin = session.entries[-1], session.entries[1]
    other = session.transcript.fork_of(tip).versions[0]
    assert facts([tip]) == facts([twin]) == facts([other])
    assert (other.place(), tip.place()) == (Place(1, 2), Place(2, 2))

    rig.chats.continue_reply(session)
    rig.settle(session)
    assert session.entries[-1] is tip and tip.content.startswith("Sure.")
    asked = dialogue(["yes", "Sure.", "tell me more", "Sure."])
    assert tip.stats.prompt_tokens == len(continue_prompt(rig.client.engine.tokenizer, asked))

    rig.chats.delete(session, other)
    assert session.transcript.fork_of(tip).versions == [tip] and session.entries[-1] is tip
    assert [m.id for m in rig.store.siblings(tip.store_id)] == [tip.store_id]
    [restored] = rig.restart()
    assert ids(restored.entries) == ids(session.entries)
    assert restored.entries[-1].content == tip.content
