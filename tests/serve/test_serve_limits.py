"""What `chatpage serve` refuses before it does any work (issue 20, items 2 and 8): bodies too
large (413) or too slow (408), prompts far past the context window, too many or too long stop
strings, JSON nested too deep, a model that is not a name; and on a server with no API key,
bodies that are not JSON (415) and Host names that are not its own (403: DNS rebinding).

One real keyless server on a free port with a 64 KiB body limit and a 1 s body timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import pytest
from serve_helpers import running_server

from chatpage.vocab import MAX_STOP_CHARS, MAX_STOP_STRINGS

pytestmark = pytest.mark.slow  # a chatpage serve of its own (a subprocess)

HI = [{"role": "user", "content": "Say something."}]
LIMIT = 64 << 10


@pytest.fixture(scope="module")
def url(tiny_llama_dir, tmp_path_factory):
    with running_server(
        tiny_llama_dir,
        tmp_path_factory.mktemp("serve"),
        extra=["--max-body", "64KiB", "--body-timeout", "1"],
    ) as url:
        yield url


def _chat(url: str, **body) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={"messages": HI, "max_tokens": 2, **body}, timeout=60
    )


def _answers(url: str) -> None:
    """The server still answers a plain request."""
    r = _chat(url)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"


def test_a_body_over_the_limit_is_413_by_its_length_or_as_it_streams(url):
    big = {"messages": [{"role": "user", "content": "x" * LIMIT}]}
    r = httpx.post(f"{url}/v1/chat/completions", json=big, timeout=60)
    assert r.status_code == 413
    assert r.json()["error"]["message"] == (
        f"the request body is larger than {LIMIT} bytes, "
        "this server's limit (chatpage serve --max-body)"
    )

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(80):
            yield b"y" * 1024
        yield b'"}]}'

    r = httpx.post(
        f"{url}/v1/chat/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 413
    _answers(url)


def test_a_body_that_never_finishes_arriving_is_408(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{"messages"'
        )
        data = b""
        while chunk := s.recv(65536):  # until the server closes the connection
            data += chunk
    answer = data.decode()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert "did not arrive within 1 s" in answer
    _answers(url)


def test_a_prompt_far_past_the_context_window_is_400_by_its_characters(url):
    r = _chat(url, messages=[{"role": "user", "content": "word " * 7000}])
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith(
        "the prompt is 35000 characters, far more than the context window of 1024 tokens"
    )


def test_too_many_or_too_long_stop_strings_are_400(url):
    for stop in (["s"] * (MAX_STOP_STRINGS + 1), ["s" * (MAX_STOP_CHARS + 1)]):
        r = _chat(url, stop=stop)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "stop", err
        assert (
            f"at most {MAX_STOP_STRINGS} non-empty strings of at most {MAX_STOP_CHARS} "
            "characters" in err["message"]
        )
    assert _chat(url, stop=["s" * MAX_STOP_CHARS] * MAX_STOP_STRINGS).status_code == 200


def test_deep_json_and_a_model_that_is_not_a_name_are_400(url):
    deep = b'{"messages": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"
    r = httpx.post(
        f"{url}/v1/chat/completions",
        content=deep,
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    for model in (["llama"], {"id": "llama"}, 7):
        r = _chat(url, model=model)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "model", err
        assert err["message"].startswith("model must be a string")
    _answers(url)


def test_a_keyless_server_takes_json_only_and_only_under_its_own_names(url):
    port = url.rsplit(":", 1)[1]
    body = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"Content-Type": kind} if kind else {}
        r = httpx.post(f"{url}/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 415, (kind, r.text)
        assert "must be JSON" in r.json()["error"]["message"]
    for name in ("evil.example", f"evil.example:{port}", f"localhost.evil.example:{port}"):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json", "Host": name},
        )
        assert r.status_code == 403, name
        assert f"the Host header {name!r} does not name this server" in r.json()["error"]["message"]
        assert httpx.get(f"{url}/v1/models", headers={"Host": name}).status_code == 403
    for name in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", "LOCALHOST."):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            content=body,
            headers={"Content-Type": "application/json; charset=utf-8", "Host": name},
        )
        assert r.status_code == 200, (name, r.text)
    reply = openai.OpenAI(base_url=f"{url}/v1", api_key="none").chat.completions.create(
        model="llama", messages=HI, max_tokens=2
    )
    assert reply.choices[0].finish_reason == "length"
