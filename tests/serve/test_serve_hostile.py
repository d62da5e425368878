"""Requests that used to hurt other work on `chatpage serve` (issue 40, items 1, 2, 10, 12): each
is refused with a 4xx naming what is wrong, while a stream already running goes on to its end.

One real keyless server (a tiny random Llama, the default model's tokenizer) in a subprocess,
driven by httpx.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from chatpage.engine.sampling_params import MAX_LOGPROB_ENTRIES
from chatpage.engine.text.grammar import MAX_SPEC_CHARS

pytestmark = pytest.mark.slow  # a chatpage serve of its own (a subprocess)

HI = [{"role": "user", "content": "Say something."}]
VOCAB = 49152


def _chat(url: str, **body) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **body}, timeout=120
    )


@contextmanager
def streaming(url: str) -> Iterator[dict]:
    """A long stream running through the block (its first chunk already here); on exit, its
    end: the finish reason and any error the stream carried."""
    body = {"messages": HI, "max_tokens": 160, "ignore_eos": True, "stream": True}
    seen: dict = {"finish": None, "error": None}
    first = threading.Event()

    def read() -> None:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                first.set()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    seen["error"] = chunk["error"]["message"]
                for choice in chunk.get("choices", []):
                    seen["finish"] = choice.get("finish_reason") or seen["finish"]
        first.set()

    thread = threading.Thread(target=read)
    thread.start()
    assert first.wait(60)
    yield seen
    thread.join(120)
    assert not thread.is_alive()


def _refused(r: httpx.Response, status: int, param: str | None, words: str) -> None:
    err = r.json()["error"]
    assert r.status_code == status, (r.status_code, err)
    assert err["param"] == param and words in err["message"], err


KEYS = [
    ("9" * 20, "keys must be token ids (0, 1, 2, ...), got '99999999999999999999'"),
    (str(2**63), f"got '{2**63}'"),
    ("²", "got '²'"),
    ("9" * 5000, "got '999999999999999999999999...'"),
    (str(VOCAB), f"names token {VOCAB}, which is not in the model's vocabulary (ids 0 to"),
    ("12345678901", "names token 12345678901, which is not in"),
]


def test_a_logit_bias_key_outside_the_vocabulary_is_400_and_hurts_no_stream(url):
    with streaming(url) as other:
        for key, words in KEYS:
            _refused(_chat(url, logit_bias={key: 1}), 400, "logit_bias", words)
    assert other == {"finish": "length", "error": None}
    assert _chat(url, logit_bias={str(VOCAB - 1): -100}).status_code == 200


def _schema(properties: int) -> dict:
    names = {f"p{i}": {"type": "string"} for i in range(properties)}
    return {
        "type": "json_schema",
        "json_schema": {"name": "big", "schema": {"type": "object", "properties": names}},
    }


def test_a_schema_or_choice_list_too_big_to_compile_soon_is_400_and_hurts_no_stream(url):
    """10,000 properties (0.3 MB) took 14 s of compiling, on the server's loop and then on the
    engine thread; 60,000 choices 9.5 s. Refused by their size, before anything compiles."""
    where = "response_format.json_schema.schema"
    with streaming(url) as other:
        r = _chat(url, response_format=_schema(10_000))
        _refused(r, 400, where, f"characters (as JSON); at most {MAX_SPEC_CHARS} are taken")
        choices = [f"option number {i}" for i in range(60_000)]
        r = _chat(url, structured_outputs={"choice": choices})
        _refused(r, 400, "structured_outputs.choice", "characters (as JSON)")
        tools = [
            {
                "type": "function",
                "function": {"name": f"f{i}", "parameters": _schema(300)["json_schema"]["schema"]},
            }
            for i in range(10)
        ]
        _refused(_chat(url, tools=tools, tool_choice="required"), 400, "tools", "characters")
    assert other == {"finish": "length", "error": None}
    r = _chat(url, response_format=_schema(200), max_tokens=4)
    assert r.status_code == 200, r.text


def test_a_grammar_that_does_not_compile_is_400_naming_its_field(url):
    r = _chat(url, structured_outputs={"grammar": "start: nothing_defined"})
    _refused(r, 400, "structured_outputs.grammar", "does not compile")


def test_n_by_max_tokens_by_top_logprobs_is_capped(url):
    r = _chat(url, n=13, max_tokens=100_000, logprobs=True, top_logprobs=20)
    assert r.status_code == 400, r.text
    assert (
        f"more than the {MAX_LOGPROB_ENTRIES} one request may have" in r.json()["error"]["message"]
    )
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "Hi", "n": 13, "max_tokens": 100_000, "logprobs": 20},
        timeout=120,
    )
    assert r.status_code == 400 and "log-probabilities" in r.json()["error"]["message"]
    assert _chat(url, logprobs=True, top_logprobs=20).status_code == 200


@pytest.mark.parametrize("path", ["/health", "/metrics", "/version", "/v1/models"])
def test_every_route_of_a_keyless_server_refuses_a_foreign_host(url, path):
    port = url.rsplit(":", 1)[1]
    for name in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}"):
        r = httpx.get(f"{url}{path}", headers={"Host": name})
        assert r.status_code == 403, (path, name)
        assert f"the Host header {name!r} does not name this server" in r.json()["error"]["message"]
    assert httpx.get(f"{url}{path}", headers={"Host": f"localhost:{port}"}).status_code == 200
