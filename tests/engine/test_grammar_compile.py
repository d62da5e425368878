"""A grammar compiles on a grammar thread, never on the engine thread (issue 40, item 2): while
one request's grammar compiles, every other request runs to its end; a grammar that takes too
long fails its own request with a line saying so; a request cancelled while its grammar
compiles ends as cancelled. The real `LocalEngineClient` over a tiny random Llama; the compile
is held (by an event around the real `grammar_text`) instead of made slow, so nothing is timed.
"""

from __future__ import annotations

import threading

import pytest

from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine import client as client_module
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.client import ChatRequest, FinishReason, LocalEngineClient, RequestUpdate
from chatpage.engine.outputs import RequestOutput
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text import grammar

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
ASK = [{"role": "user", "content": "A number?"}]
DIGITS = Structured(GrammarKind.REGEX, "[0-9]{3}")


class _Reply:
    def __init__(self) -> None:
        self.outputs = OutputAccumulator()
        self.out: RequestOutput | None = None
        self.done = threading.Event()

    def __call__(self, update: RequestUpdate) -> None:
        self.out = self.outputs.add(update)
        if update.finished:
            self.done.set()


@pytest.fixture
def held(monkeypatch) -> threading.Event:
    """Every grammar compile waits for this event (set at the end of the test)."""
    release = threading.Event()
    real = grammar.grammar_text

    def held_text(spec):
        release.wait(120)
        return real(spec)

    monkeypatch.setattr(grammar, "grammar_text", held_text)
    yield release
    release.set()


@pytest.fixture(scope="module")
def client(tiny_llama_dir):
    client = LocalEngineClient(str(tiny_llama_dir), EngineConfig(kv_cache_bytes=64 * BLOCK_BYTES))
    client.start()
    assert client.wait_ready(120), client.error
    yield client
    client.close()


def _submit(client: LocalEngineClient, **params) -> tuple[str, _Reply]:
    reply = _Reply()
    rid = client.submit(
        ChatRequest(ASK, SamplingParams(temperature=0, max_tokens=4, **params)), reply
    )
    return rid, reply


def test_other_requests_run_while_a_grammar_compiles(client, held):
    _, constrained = _submit(client, structured=DIGITS)
    plain = [_submit(client)[1] for _ in range(3)]
    for reply in plain:  # (with the compile on the engine thread, none of them would end)
        assert reply.done.wait(60), "a request waited for another request's grammar"
        assert reply.out.error is None
    assert not constrained.done.is_set()
    held.set()
    assert constrained.done.wait(60)
    out = constrained.out
    assert out.error is None and out.outputs[0].text.isdigit(), out


def test_a_grammar_that_compiles_too_long_fails_its_request_alone(client, held, monkeypatch):
    monkeypatch.setattr(client_module, "COMPILE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(grammar, "COMPILE_TIMEOUT_S", 0.5)
    slow = Structured(GrammarKind.REGEX, "[a-c]{5}")
    _, constrained = _submit(client, structured=slow)
    _, plain = _submit(client)
    assert constrained.done.wait(60) and plain.done.wait(60)
    assert constrained.out.error == (
        "the regex did not compile within 0.5 s; make it smaller or simpler"
    )
    assert [o.finish_reason for o in constrained.out.outputs] == [FinishReason.ERROR]
    assert plain.out.error is None


def test_a_request_cancelled_while_its_grammar_compiles_ends_cancelled(client, held):
    rid, constrained = _submit(client, structured=Structured(GrammarKind.REGEX, "[d-f]{5}"))
    _, plain = _submit(client)
    assert plain.done.wait(60)  # (the submit is parked by now: the engine thread is past it)
    client.cancel(rid)
    assert constrained.done.wait(60)
    assert constrained.out.error is None
    assert [o.finish_reason for o in constrained.out.outputs] == [FinishReason.ABORT]
