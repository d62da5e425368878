"""Branches over the real engine (tiny random Llama, no app): a fork's first reply is served
from the prefix cache up to the fork, and /continue goes on from the reply's own tokens."""

from __future__ import annotations

from helpers import settle

from chatpage.config.personas import Persona
from chatpage.engine.text.chat_template import continue_prompt, render_prompt

PERSONA = Persona(
    "tiny",
    "a test persona",
    "You are tiny. Answer briefly and plainly, always.",
    temperature=0.0,
    max_tokens=12,
)


def new_prompt_tokens(prompt: list[int], before: list[int]) -> int:
    """How many tokens of `prompt` come after what it shares with `before`."""
    shared = 0
    for a, b in zip(prompt, before, strict=False):
        if a != b:
            break
        shared += 1
    return len(prompt) - shared


def test_a_branch_computes_only_its_new_tokens(rig) -> None:
    chats, client, events = rig
    tokenizer, block = client.engine.tokenizer, client.config.block_size
    session = chats.open(PERSONA)
    for question in ("What is a page table?", "And a block table, in one line?"):
        chats.send(session, question)
        settle(chats, events, session)
    second_prompt = render_prompt(tokenizer, session.for_model(upto=session.entries[2]))

    chats.edit(session, session.entries[2])  # fork at the second question
    chats.send(session, "And a TLB, in two lines?")
    settle(chats, events, session)
    stats = session.entries[-1].stats
    prompt = render_prompt(tokenizer, session.for_model(upto=session.entries[2]))
    assert stats.prompt_tokens == len(prompt)
    computed = stats.prompt_tokens - stats.prefix_hit_tokens
    assert computed <= new_prompt_tokens(prompt, second_prompt) + block
    assert stats.prefix_hit_tokens >= len(prompt) - new_prompt_tokens(prompt, second_prompt) - block

    chats.regenerate(session, session.entries[1])  # fork at the first reply
    settle(chats, events, session)
    stats = session.entries[1].stats
    assert session.entries[1].place().count == 2
    assert stats.prompt_tokens - stats.prefix_hit_tokens <= block  # its prompt was all cached


def test_continue_goes_on_from_the_reply(rig) -> None:
    chats, client, events = rig
    tokenizer, block = client.engine.tokenizer, client.config.block_size
    session = chats.open(PERSONA)
    chats.send(session, "Tell me a long story about paging.")
    settle(chats, events, session)
    reply = session.entries[-1]
    first_text, first_tokens = reply.content, reply.stats.tokens
    chats.continue_reply(session)
    assert session.streaming
    settle(chats, events, session)
    assert session.entries[-1] is reply and len(session.entries) == 2
    assert reply.content.startswith(first_text) and len(reply.content) > len(first_text)
    assert reply.stats.tokens > first_tokens
    prompt = continue_prompt(
        tokenizer,
        session.for_model(upto=reply)[:-1] + [{"role": "assistant", "content": first_text}],
    )
    assert reply.stats.prompt_tokens == len(prompt)
    asked = render_prompt(tokenizer, session.for_model(upto=session.entries[0]))
    assert prompt[: len(asked)] == asked  # the reply's first prompt, then its text
    assert reply.stats.prefix_hit_tokens >= len(asked) - block
