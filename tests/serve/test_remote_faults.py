"""`--backend URL` against servers that misbehave (real HTTP servers on free ports, written here):
one that stops mid-stream, one that never answers, one that sends only keep-alive comments, one
that closes the stream before the reply ends, and one whose probe and /metrics answers are not
numbers. Each reply ends (an error naming the server), `ask` exits non-zero, and the TUI gets
ready and marks the reply failed."""

from __future__ import annotations

import json
import os
import queue
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from serve_helpers import REPO, connected

from chatpage.config.settings import Settings, load_settings
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.client import ChatRequest, FinishReason
from chatpage.engine.outputs import RequestOutput
from chatpage.engine.sampling_params import SamplingParams
from chatpage.remote.client import RemoteEngineClient
from chatpage.remote.stats import RemoteStats
from chatpage.ui.app import ChatApp

HI = [{"role": "user", "content": "Say something."}]
IDLE_S = 0.5
BAD_METRICS = (
    "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running NaN\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n"
    "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 1.7\n"
)


def chunk(text: str) -> bytes:
    body = {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


class Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 by hand: /v1/models and /metrics as configured, 404 for the rest of the probe,
    and /v1/chat/completions as the server's ``chat`` mode says."""

    server: Rogue

    def handle(self) -> None:
        while True:
            line = self.rfile.readline()
            if not line:
                return
            path = line.decode().split(" ")[1]
            length = 0
            while (header := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = header.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            self.rfile.read(length)
            if path == "/v1/chat/completions":
                self.server.chats += 1
                self.chat(self.server.chat)
                return
            if path == "/v1/models":
                self.send(
                    200,
                    json.dumps(
                        {
                            "object": "list",
                            "data": [
                                {
                                    "id": "m",
                                    "owned_by": "rogue",
                                    "max_model_len": self.server.context,
                                }
                            ],
                        }
                    ),
                )
            elif path == "/metrics" and self.server.metrics is not None:
                self.send(200, self.server.metrics, "text/plain")
            else:
                self.send(404, json.dumps({"error": {"message": f"no {path} here"}}))

    def send(self, status: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.wfile.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )

    def chat(self, mode: str) -> None:
        stop = self.server.stop
        if mode == "silent":  # never even the headers
            stop.wait()
            return
        self.wfile.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Connection: close\r\n\r\n" + chunk("Hel") + chunk("lo")
        )
        if mode == "stall":
            stop.wait()
        elif mode == "keepalive":
            while not stop.wait(0.05):
                try:
                    self.wfile.write(b": keep-alive\n\n")
                except OSError:  # the client gave up and closed the connection
                    return
        # "cut": the connection closes here, with no finish reason and no [DONE]


class Rogue(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, chat: str, context: object, metrics: str | None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.chat, self.context, self.metrics = chat, context, metrics
        self.stop = threading.Event()
        self.chats = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def rogue(chat: str, context: object = 2048, metrics: str | None = None) -> Iterator[Rogue]:
    server = Rogue(chat, context, metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.shutdown()
        server.server_close()
        thread.join()


def reply(client: RemoteEngineClient) -> RequestOutput:
    """The outputs of one reply, once it ended (in time, or the test fails)."""
    updates: queue.SimpleQueue = queue.SimpleQueue()
    client.submit(ChatRequest(HI, SamplingParams(max_tokens=8)), updates.put)
    outputs = OutputAccumulator()
    while not (out := outputs.add(updates.get(timeout=20))).finished:
        pass
    return out


@pytest.mark.slow  # waits out a server's retries and deadlines
@pytest.mark.parametrize("mode", ["stall", "silent", "keepalive"])
def test_a_silent_server_fails_the_reply_after_the_idle_deadline(mode):
    with rogue(mode) as server, connected(server.url, IDLE_S) as client:
        out = reply(client)
    (output,) = out.outputs
    assert output.finish_reason is FinishReason.ERROR
    assert out.error == (
        f"{server.url} sent nothing for 0.5 s, so the reply was given up; to "
        "wait longer, raise backend_timeout in config.yaml or pass "
        "--backend-timeout SECONDS"
    )
    assert output.text == ("" if mode == "silent" else "Hello")  # what came is kept


def test_a_stream_cut_before_the_reply_ends_is_an_error():
    with rogue("cut") as server, connected(server.url, IDLE_S) as client:
        out = reply(client)
    (output,) = out.outputs
    assert output.finish_reason is FinishReason.ERROR and output.text == "Hello"
    assert out.error == (
        f"OpenAI-compatible server at {server.url} ended the stream before the "
        "reply was finished (no finish reason, no [DONE]); the text so far is "
        "kept"
    )


def errors(stderr: str) -> list[str]:
    """The error lines of `ask` (the notes about what the server cannot do aside)."""
    return [line for line in stderr.splitlines() if line.startswith("chatpage: error")]


def ask(url: str, home: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, "-m", "chatpage.cli", "ask", "--backend", url, *flags, "hello"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # waits out a server's retries and deadlines
def test_ask_backend_exits_non_zero_on_a_stalled_or_cut_stream(tmp_path):
    (tmp_path / "config" / "chatpage").mkdir(parents=True)
    (tmp_path / "config" / "chatpage" / "config.yaml").write_text("backend_timeout: 1\n")
    with rogue("keepalive") as server:
        done = ask(server.url, tmp_path)  # the deadline from config.yaml
    assert done.returncode == 1 and done.stdout == "Hello"
    assert errors(done.stderr) == [
        f"chatpage: error: {server.url} sent nothing for 1 s, so the "
        "reply was given up; to wait longer, raise backend_timeout in "
        "config.yaml or pass --backend-timeout SECONDS"
    ]
    with rogue("cut") as server:
        done = ask(server.url, tmp_path, "--backend-timeout", "30")
    assert done.returncode == 1 and done.stdout == "Hello"
    (line,) = errors(done.stderr)
    assert "ended the stream before the reply was finished" in line
    refused = ask("http://127.0.0.1:9", tmp_path, "--backend-timeout", "soon")
    assert refused.returncode == 2
    assert "invalid number of seconds 'soon': use a number of seconds above zero" in refused.stderr


def test_backend_timeout_setting():
    assert Settings().backend_timeout == 120.0
    path = Path(os.devnull)
    assert load_settings(path, {"backend_timeout": 7.5})[0].backend_timeout == 7.5
    settings, warnings = load_settings(path, {"backend_timeout": float("nan")})
    assert settings.backend_timeout == 120.0
    assert warnings == [
        "command line: backend_timeout = nan is not valid; expected a number of "
        "seconds above zero, e.g. 120; using the default value"
    ]


def test_bad_probe_and_metrics_values_are_ignored_with_a_note():
    with (
        rogue("cut", context="abc", metrics=BAD_METRICS) as server,
        connected(server.url, IDLE_S) as client,
    ):
        assert client.max_model_len == 0
        assert (
            f"{server.url}/v1/models max_model_len is 'abc', not a number of tokens; "
            "ignored" in client.warnings[0]
        )
        deadline = time.monotonic() + 10
        while (stats := client.stats()) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert isinstance(stats, RemoteStats) and stats.reachable
    assert (stats.num_running, stats.num_waiting, stats.kv_usage) == (None, 2, 1.0)
    assert stats.notes == (
        f"OpenAI-compatible server at {server.url}'s /metrics says "
        "vllm:num_requests_running = nan: not a figure the gauge can show; "
        "ignored",
    )


async def test_tui_gets_ready_over_bad_values_and_marks_a_cut_reply_failed():
    with rogue("cut", context="abc", metrics=BAD_METRICS) as server:
        app = ChatApp(settings=Settings(), client=RemoteEngineClient(server.url))
        async with app.run_test(size=(150, 48)) as pilot:

            async def until(condition, what: str) -> None:
                deadline = time.monotonic() + 20
                while not condition():
                    assert time.monotonic() < deadline, f"timed out waiting for {what}"
                    await pilot.pause(0.05)

            gauge = app.chat.gauge
            await until(lambda: "ready" in gauge.status, "ready")
            assert any("max_model_len is 'abc'" in n for n in app.notices)
            session = app.chat.current
            await app.chat.submit_prompt("hello")
            await until(lambda: session.entries[-1].status == "error", "the failed reply")
            entry = session.entries[-1]
            assert entry.content == "Hello" and "ended the stream before" in entry.error
            await until(
                lambda: "not a figure the gauge can show" in gauge.render().plain,
                "the note on the metrics",
            )
