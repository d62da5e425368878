"""Each turn's prompt carries the replies as the token ids the model sampled, so the prefix cache
serves the whole chat before the new message (tiny random Llama: its sampled replies are token
sequences that tokenizing their text again would split differently)."""

from __future__ import annotations

from dataclasses import replace

from helpers import settle

from chatpage.chat.saved import entry_from, reply_metadata
from chatpage.config.personas import Persona
from chatpage.engine.text.chat_template import continue_prompt, render_prompt, render_text

PERSONA = Persona(
    "sampler",
    "a test persona",
    "You are a poet. Write long, free verse.",
    temperature=1.0,
    max_tokens=40,
)


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_sampled_replies_are_reused_whole_on_the_next_turn(rig) -> None:
    chats, client, events = rig
    tok, block = client.engine.tokenizer, client.config.block_size
    session = chats.open(PERSONA)
    chats.set_setting(session, "seed", 7)
    sent_before: list[int] = []
    for turn, question in enumerate(
        ("Write a poem about the sea.", "Another, about the sky.", "And one about stones.")
    ):
        chats.send(session, question)
        settle(chats, events, session)
        question_entry, reply = session.entries[-2], session.entries[-1]
        assert reply.status == "done" and reply.token_ids is not None
        assert tok.decode(list(reply.token_ids), skip_special_tokens=True) == reply.content
        stats = reply.stats
        prompt = render_prompt(
            tok,
            session.for_model(upto=question_entry),
            reply_ids=session.reply_ids(client.model_name, question_entry),
        )
        assert stats.prompt_tokens == len(prompt)
        assert tok.decode(prompt) == render_text(tok, session.for_model(upto=question_entry))
        if turn:
            new = len(prompt) - shared(prompt, sent_before)
            computed = stats.prompt_tokens - stats.prefix_hit_tokens
            assert new < 40  # the new message and the template around it
            assert computed <= new + block, (turn, computed, new)
        sent_before = prompt + list(reply.token_ids)
    # what re-tokenizing the replies would have sent differs from what the cache holds inside
    # the first reply already: every block from there on would be computed again each turn
    retokenized = render_prompt(tok, session.for_model(upto=session.entries[-2]))
    first_reply_at = len(render_prompt(tok, session.for_model(upto=session.entries[0])))
    assert shared(retokenized, sent_before) < first_reply_at + len(session.entries[1].token_ids)


def test_ids_that_are_not_the_reply_are_not_used(rig) -> None:
    _chats, client, _events = rig
    tok = client.engine.tokenizer
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hi."},
        {"role": "assistant", "content": "Hi there."},
        {"role": "user", "content": "Again."},
    ]
    plain = render_prompt(tok, messages)
    other = tok.encode("Hello there.", add_special_tokens=False)
    assert render_prompt(tok, messages, reply_ids={2: other}) == plain
    assert render_prompt(tok, messages, reply_ids={1: other, 9: other}) == plain
    assert render_prompt(tok, messages, reply_ids={2: [10**9]}) == plain  # not a token id
    split = [tok.encode("Hi", add_special_tokens=False)[0]] + tok.encode(
        " there.", add_special_tokens=False
    )
    with_ids = render_prompt(tok, messages, reply_ids={2: split})
    assert tok.decode(with_ids) == tok.decode(plain)
    head = render_prompt(tok, messages[:2])
    assert with_ids[: len(head) + len(split)] == head + split
    assert continue_prompt(tok, messages[:3], reply_ids={2: split}) == head + split


def test_reply_ids_are_saved_with_the_reply(rig) -> None:
    chats, client, events = rig
    session = chats.open(replace(PERSONA, max_tokens=6))
    chats.send(session, "Hello?")
    settle(chats, events, session)
    reply = session.entries[-1]
    back = entry_from("assistant", reply.content, reply.status, reply_metadata(reply), 1)
    assert back.token_ids == reply.token_ids and back.token_source == client.model_name
    assert session.reply_ids(client.model_name) == {2: reply.token_ids}
    assert session.reply_ids("another model") == {}
    broken = entry_from("assistant", "x", "done", {"token_ids": ["a"], "token_source": "m"}, 2)
    assert broken.token_ids is None
