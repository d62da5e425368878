"""The context fit counts with the model's tokenizer and chat template: a chat that fits by
tokens is sent whole, one a token over leaves its oldest turn out; the header's meter follows a
reply while it streams."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from helpers import PERSONA, FakeClient, alpha_and_beta, done, make_app, ready, send, wait_for

from chatpage.chat.chats import Chats
from chatpage.engine.text.chat_template import TokenCounter, render_prompt
from chatpage.engine.text.tokenizer import read_plain

PASTE = " ".join(
    f"Line {i}: the quick brown fox jumps over the lazy dog, again and again." for i in range(280)
)  # ~20,000 characters: ~5,600 tokens, not ~6,700


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    return read_plain(default_model_dir)


def chat_with_paste(tokenizer, context: int, max_tokens: int):
    client = FakeClient(max_model_len=context)
    client.counter = TokenCounter(tokenizer, "fake")
    chats = Chats(client, lambda _u: None)
    session = chats.open(replace(PERSONA, max_tokens=max_tokens))
    for question, answer in (
        ("Hi, who are you?", "I am p, a helper."),
        ("Can you read a long text?", "Yes: paste it."),
    ):
        chats.send(session, question)
        chats.requests.apply(done(f"r{len(client.submitted)}", answer))
    return client, chats, session


def whole_prompt(tokenizer, paste: str) -> list[int]:
    messages = [{"role": "system", "content": PERSONA.system_prompt}]
    for question, answer in (
        ("Hi, who are you?", "I am p, a helper."),
        ("Can you read a long text?", "Yes: paste it."),
    ):
        messages += [
            {"role": "user", "content": question},
            {"role": "assistant", "content": answer},
        ]
    return render_prompt(tokenizer, messages + [{"role": "user", "content": paste}])


@pytest.mark.parametrize("spare", [0, -1])
def test_a_chat_that_fits_by_tokens_is_sent_whole(tokenizer, spare):
    assert len(PASTE) > 20_000
    exact = len(whole_prompt(tokenizer, PASTE))
    max_tokens = 512
    assert exact + max_tokens < len(PASTE) / 3  # the old estimate would drop turns
    client, chats, session = chat_with_paste(tokenizer, exact + max_tokens + spare, max_tokens)
    chats.send(session, PASTE)
    messages = client.submitted[-1][0]
    dropped = [e for e in session.entries if e.dropped]
    if spare == 0:
        assert len(messages) == 6 and not dropped
        assert session.prompt_tokens == exact
    else:  # one token too many: the oldest turn (a question and its answer) is left out
        assert len(messages) == 4 and [e.content for e in dropped] == [
            "Hi, who are you?",
            "I am p, a helper.",
        ]
        assert session.prompt_tokens == len(render_prompt(tokenizer, messages))


def test_counts_are_kept_with_the_message(tokenizer):
    client, chats, session = chat_with_paste(tokenizer, 100_000, 16)
    first = session.entries[0]
    kept = first.token_count
    assert kept is not None and kept[0] == "fake"
    assert kept[2] == len(tokenizer.encode(first.content, add_special_tokens=False))
    chats.send(session, "more")
    assert first.token_count is kept  # not counted again
    first.content = "Hi, who are you, really?"
    chats.requests.fit(session, None)
    assert first.token_count is not kept and first.token_count[2] != kept[2]


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
async def test_the_header_counts_the_reply_as_it_streams(tmp_path, tiny_llama_dir):
    app = make_app(tiny_llama_dir, alpha_and_beta(tmp_path))
    async with app.run_test(size=(140, 44)) as pilot:
        await ready(pilot, app)
        session = app.chat.current
        header = app.chat.session_view(session).query_one(".session-header")

        def shown() -> int:
            match = re.search(r"context (\d+) / (\d+) tokens", str(header.render()))
            assert match is not None and int(match.group(2)) == app.client.max_model_len
            return int(match.group(1))

        await send(pilot, "/max 300")
        await send(pilot, "/temp 1")
        await send(pilot, "tell me a long story")
        question = session.entries[0]
        prompt = render_prompt(app.client.engine.tokenizer, session.for_model(upto=question))
        assert session.prompt_tokens == len(prompt)  # counted before it was sent, exactly
        await wait_for(
            pilot,
            lambda: session.streaming and shown() > len(prompt) + 2,
            "the meter to count the first reply's tokens while it streams",
        )
        stats = session.entries[-1].stats
        assert stats.prompt_tokens == len(prompt)
        app.chats.requests.stop(session)
        await wait_for(pilot, lambda: not session.streaming, "the stop")
        await wait_for(
            pilot,
            lambda: shown() == len(prompt) + session.entries[-1].stats.tokens,
            "the meter after the reply",
        )
