"""The conversation model without an app: turns, forks, switching, /continue, alternatives kept
as versions, the context meter and overflow (Chats over a client that records submits)."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import PERSONA, FakeClient, done, event, stopped

from chatpage.chat.changes import (
    BusyChanged,
    ContextChanged,
    EntryAdded,
    EntryRemoved,
    EntryUpdated,
    TitleChanged,
)
from chatpage.chat.chats import ChatError, Chats
from chatpage.chat.context import MESSAGE_OVERHEAD, fit
from chatpage.chat.entry import Entry, ReplyStats
from chatpage.chat.sampling import AltMode
from chatpage.chat.session import ChatSession
from chatpage.engine.client import FinishReason
from chatpage.engine.outputs import final_update


def texts(session: ChatSession) -> list[str]:
    return [e.content for e in session.entries]


def chat_with(client: FakeClient, *turns: str) -> tuple[Chats, ChatSession]:
    """A chat where each of `turns` (questions) was answered "re: <question>"."""
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    for question in turns:
        chats.send(session, question)
        chats.requests.apply(done(f"r{len(client.submitted)}", f"re: {question}"))
    return chats, session


def test_chats_turns_stop_keep_and_observer_hook():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    seen = []
    session.observers.append(lambda s, change: seen.append(type(change)))
    chats.send(session, "hi there")
    assert session.title == "hi there" and session.streaming
    messages, params, _ = client.submitted[0]
    assert messages == [
        {"role": "system", "content": "You are p."},
        {"role": "user", "content": "hi there"},
    ]
    assert params.max_tokens == 8 and params.temperature == 0.5
    with pytest.raises(ChatError, match="still streaming"):
        chats.send(session, "again")
    chats.requests.apply(event("r1", "Hel"))
    assert chats.requests.stop(session) and client.cancelled == ["r1"]
    chats.requests.apply(stopped("r1"))
    reply = session.entries[-1]
    assert (reply.content, reply.status, reply.stats.tokens) == ("Hel", "stopped", 3)
    assert not session.streaming
    assert {EntryAdded, EntryUpdated, BusyChanged, TitleChanged} <= set(seen)

    chats.set_alt_mode(session, AltMode("samples", 3))
    chats.regenerate(session)
    assert client.submitted[-1][1].n == 3 and session.alt_mode.kind == "off"
    assert texts(session) == ["hi there"]  # no version of the reply on show while choosing
    for i in range(3):
        chats.requests.apply(
            event("r2", f"alt {i}", index=i, reason=FinishReason.LENGTH, finished=i == 2)
        )
    assert session.choosing and not session.streaming
    with pytest.raises(ChatError, match="keep one of the alternatives first"):
        chats.send(session, "next")
    kept = chats.requests.keep(session, 2)
    assert (kept.content, kept.label, kept.status) == ("alt 1", "sample 2", "done")
    assert session.generation is None and session.entries[-1] is kept
    # the stopped reply and the unkept samples stay as versions of the reply
    versions = session.entries[0].replies.versions
    assert [v.content for v in versions] == ["Hel", "alt 0", "alt 1", "alt 2"]
    assert kept.place().label() == "◀ 3/4 ▶"


def test_regenerating_an_earlier_reply_forks_and_keeps_what_followed():
    client = FakeClient()
    chats, session = chat_with(client, "one", "two", "three")
    first_reply = session.entries[1]
    chats.regenerate(session, first_reply)
    assert client.submitted[-1][0][-1] == {"role": "user", "content": "one"}  # sent up to it
    assert len(client.submitted[-1][0]) == 2
    chats.requests.apply(done("r4", "re: one, again"))
    assert texts(session) == ["one", "re: one, again"]
    place = session.entries[1].place()
    assert (place.number, place.count, place.forked) == (2, 2, True)
    back = chats.switch(session, session.entries[1], -1)
    assert back is first_reply
    assert texts(session) == ["one", "re: one", "two", "re: two", "three", "re: three"]
    assert chats.switch(session, back, -1) is back  # clamped at the first version
    chats.switch(session, back, 1)
    chats.send(session, "a new way")  # goes on from the version on show
    assert [m["content"] for m in client.submitted[-1][0][1:]] == [
        "one",
        "re: one, again",
        "a new way",
    ]


def test_editing_an_earlier_message_forks_at_it():
    client = FakeClient()
    chats, session = chat_with(client, "one", "two")
    two = session.entries[2]
    two.attachments = []
    assert chats.edit(session, session.entries[0]) == "one"
    assert texts(session) == ["one", "re: one", "two", "re: two"]  # nothing goes away
    chats.send(session, "one, rephrased")
    assert texts(session) == ["one, rephrased", ""]
    assert session.editing is None
    assert client.submitted[-1][0][1:] == [{"role": "user", "content": "one, rephrased"}]
    assert session.entries[0].place().label() == "◀ 2/2 ▶"
    chats.requests.apply(done("r3", "re: rephrased"))
    chats.switch(session, session.entries[0], -1)
    assert texts(session) == ["one", "re: one", "two", "re: two"]
    with pytest.raises(ChatError, match="no message of yours"):
        chats.edit(Chats(client, lambda e: None).open(PERSONA))


def test_continue_extends_a_stopped_reply_from_its_text():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    with pytest.raises(ChatError, match="no reply to continue"):
        chats.continue_reply(session)
    chats.send(session, "tell a story")
    chats.requests.apply(event("r1", "Once upon"))
    chats.requests.stop(session)
    chats.requests.apply(stopped("r1"))
    reply = session.entries[-1]
    chats.continue_reply(session)
    messages, _, _ = client.submitted[-1]
    assert client.continued == [False, True]
    assert messages[-1] == {"role": "assistant", "content": "Once upon"}
    assert reply.status == "streaming" and session.streaming
    chats.requests.apply(event("r2", " a time"))
    assert reply.content == "Once upon a time" and reply.stats.tokens == 9 + 7
    chats.requests.apply(done("r2", "."))
    assert (reply.content, reply.status) == ("Once upon a time.", "done")
    assert session.entries[-1] is reply and len(session.entries) == 2  # extended, not added


def test_deleting_a_message_removes_what_followed_and_shows_another_version():
    client = FakeClient()
    chats, session = chat_with(client, "one", "two")
    chats.regenerate(session, session.entries[1])
    chats.requests.apply(done("r3", "re: one (b)"))
    seen = []
    session.observers.append(lambda s, change: seen.append(change))
    gone = session.entries[1]
    chats.delete(session, gone)
    assert texts(session) == ["one", "re: one", "two", "re: two"]
    assert seen == [EntryRemoved(gone, session.entries[1])]  # the version that took its place
    chats.delete(session, session.entries[0])
    assert session.entries == []


def test_chats_compare_shapes_the_next_reply_offers_versions_and_reports_errors():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    chats.compare(session, "temperature", ["0.4", "0.9"])  # the next reply, as /samples
    assert session.alt_mode.describe() == "compare temp=0.4,0.9"
    chats.send(session, "first")
    assert [c.label for c in session.generation.candidates] == ["temp=0.4", "temp=0.9"]
    assert session.alt_mode.kind == "off"  # once
    for rid in ("r1", "r2"):
        chats.requests.apply(event(rid, "x", finished=True, reason=FinishReason.STOP))
    chats.requests.keep(session, 1)
    chats.send(session, "q")
    chats.requests.apply(event("r3", "a", finished=True, reason=FinishReason.STOP))
    chats.compare(session, "temperature", ["0.2", "0.8", "1.2"])
    assert len(client.submitted) == 3  # nothing asked yet: ctrl+r asks the last again
    chats.regenerate(session)
    temps = [p.temperature for _, p, _ in client.submitted[3:]]
    assert temps == [0.2, 0.8, 1.2]
    assert [c.label for c in session.generation.candidates] == ["temp=0.2", "temp=0.8", "temp=1.2"]
    assert session.entries[-1].role == "user"  # the old reply gives way to the comparison
    for rid in ("r4", "r5", "r6"):
        chats.requests.apply(
            final_update(rid, FinishReason.ERROR, error="the prompt is 2000 tokens but ...")
        )
    assert session.generation is None
    assert session.entries[-1].status == "error"
    assert "2000 tokens" in session.entries[-1].error
    assert [v.content for v in session.entries[-2].replies.versions] == ["a", ""]
    with pytest.raises(ValueError, match="temperature must be"):
        chats.compare(session, "temperature", ["0.2", "-3"])
    with pytest.raises(ChatError, match="different values"):
        chats.compare(session, "temperature", ["0.2", "0.20"])


# -- context ---------------------------------------------------------------------------------------
def test_the_meter_follows_the_reply_on_show():
    client = FakeClient(max_model_len=1024)
    chats, session = chat_with(client, "one")
    assert session.context_tokens == 1024
    assert session.used_tokens == 20 + len("re: one")  # its prompt and its tokens
    chats.send(session, "two")
    chats.requests.apply(event("r2", "abc", prompt_tokens=40))
    assert session.used_tokens == 43  # live while it streams


def test_overflow_drops_the_oldest_turns_but_keeps_them():
    notices: list[str] = []
    client = FakeClient(max_model_len=200)
    chats = Chats(client, lambda e: None, notices.append)
    session = chats.open(PERSONA)
    long = "x" * 150  # about 50 tokens each, counted cautiously
    for n in range(4):
        chats.send(session, f"{n} {long}")
        chats.requests.apply(done(f"r{n + 1}", "ok"))
    sent = client.submitted[-1][0]
    assert sent[0] == {"role": "system", "content": "You are p."}  # the system prompt stays
    assert sent[-1]["content"].startswith("3 ")  # the question being answered stays
    assert len(sent) < 1 + 7  # older turns were left out...
    dropped = [e for e in session.entries if e.dropped]
    assert dropped and dropped[0] is session.entries[0]  # ...oldest first, whole turns
    assert len(dropped) % 2 == 0 and dropped[-1].role == "assistant"
    assert len(session.entries) == 8  # ...and nothing left the chat
    assert notices and "left out of what the model sees" in notices[-1]
    assert all(e.content not in {m["content"] for m in sent} for e in dropped if e.role == "user")

    chats.edit(session, session.entries[0])  # a short branch at the top: nothing left out
    chats.send(session, "short")
    chats.requests.apply(done("r5", "ok"))
    assert not any(e.dropped for e in session.entries)
    notices.clear()
    chats.switch(session, session.entries[0], -1)  # back to the long one: greyed again, quietly
    marks = [e.dropped for e in session.entries]
    assert marks[0] and not marks[-1] and marks == sorted(marks, reverse=True)  # oldest first
    assert notices == []


def test_a_restored_chat_learns_its_context_when_the_model_loads():
    client = FakeClient()
    chats, session = chat_with(client, "x" * 600, "y" * 600, "z")
    assert session.context_tokens == 0 and not any(e.dropped for e in session.entries)
    client.max_model_len = 300
    seen = []
    session.observers.append(lambda s, change: seen.append(change))
    chats.model_ready()
    assert session.context_tokens == 300 and ContextChanged() in seen
    assert session.entries[0].dropped and not session.entries[-1].dropped


def test_fit_counts_replies_exactly_and_keeps_the_last_message():
    question = Entry("user", "q" * 30)
    reply = Entry("assistant", "r" * 300, stats=ReplyStats(tokens=10))
    last = Entry("user", "z" * 3000)
    result = fit("s", [question, reply, last], reply_tokens=5, context_tokens=100)
    assert question.dropped and reply.dropped and not last.dropped
    assert result.dropped == 2 and result.needed > 100  # still too long: the engine will say
    again = fit("s", [question, reply], reply_tokens=5, context_tokens=10_000)
    assert not question.dropped and again.dropped == 0
    assert again.needed == 1 + 10 + 5 + 10 + 3 * MESSAGE_OVERHEAD  # the reply by its count


def test_a_batch_of_updates_is_applied_in_order_each_adding_its_delta():
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    plain, alts = chats.open(PERSONA), chats.open(PERSONA)
    chats.send(plain, "one")
    chats.set_alt_mode(alts, AltMode("samples", 2))
    chats.send(alts, "two")
    changes = []
    plain.observers.append(lambda s, change: changes.append(change))
    chats.requests.apply_all(
        [
            event("r1", "a"),
            event("r2", "x", index=0),
            event("r1", "b"),
            event("r2", "y", index=1),
            event("r2", "z", index=0),
            event("r1", "c"),
        ]
    )
    assert [(type(c), c.delta.text) for c in changes] == [(EntryUpdated, t) for t in "abc"]
    assert plain.entries[-1].content == "abc" and plain.entries[-1].stats.tokens == 3
    assert [c.text for c in alts.generation.candidates] == ["xz", "y"]
    # an output's end is applied even when more updates of its request follow in the batch
    chats.requests.apply_all(
        [
            event("r2", "z", index=0, reason=FinishReason.STOP),
            event("r2", "y", index=1, reason=FinishReason.LENGTH, finished=True),
            done("r1", "d"),
        ]
    )
    assert [c.finish_reason for c in alts.generation.candidates] == [
        FinishReason.STOP,
        FinishReason.LENGTH,
    ]
    assert alts.choosing and not plain.streaming and plain.entries[-1].content == "abcd"


def test_outputs_ending_in_the_same_step_end_together_in_the_final_update():
    """When n samples end in the same step, their ends come in one update, the request's last."""
    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    chats.set_alt_mode(session, AltMode("samples", 3))
    chats.send(session, "three please")
    chats.requests.apply_all(
        [event("r1", "a", index=0), event("r1", "b", index=1), event("r1", "c", index=2)]
    )
    chats.requests.apply(event("r1", "a", index=0, reason=FinishReason.STOP))
    assert session.streaming  # two outputs are still going
    ends = [
        event("r1", t, index=i, reason=r)
        for i, t, r in ((1, "b", FinishReason.LENGTH), (2, "c", FinishReason.STOP))
    ]
    chats.requests.apply(
        dataclasses.replace(ends[0], outputs=ends[0].outputs + ends[1].outputs, finished=True)
    )
    assert [(c.text, c.stats.tokens, c.finish_reason) for c in session.generation.candidates] == [
        ("aa", 2, "stop"),
        ("bb", 2, "length"),
        ("cc", 2, "stop"),
    ]
    assert session.choosing and not session.streaming


def test_a_regenerate_or_an_edit_drafts_from_the_replies_it_replaces():
    """The other versions of the turn go with the request as draft texts (speculative
    decoding drafts from them); a new question has none; /spec off asks for no speculation."""
    client = FakeClient()
    chats, session = chat_with(client, "one", "two")
    assert client.requests[-1].draft_texts == () and client.requests[-1].params.speculate
    chats.regenerate(session, session.entries[1])
    assert client.requests[-1].draft_texts == ("re: one",)
    chats.requests.apply(done("r3", "re: one, again"))
    chats.edit(session, session.entries[0])
    chats.send(session, "one, rephrased")  # the earlier question's replies, the latest first
    assert client.requests[-1].draft_texts == ("re: one, again", "re: one")
    chats.requests.apply(done("r4", "re: rephrased"))
    assert "off" in chats.set_speculate(session, "off")
    chats.send(session, "three")
    assert client.requests[-1].params.speculate is False
    with pytest.raises(ChatError, match="/spec takes on or off"):
        chats.set_speculate(session, "maybe")
    off = dataclasses.replace(PERSONA, speculate=False)
    assert chats.open(off).speculate is False
