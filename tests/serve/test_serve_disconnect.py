"""A client that goes away mid-reply frees its KV blocks at once: streamed or whole, chat or
completion, one choice or several. The real server runs on a thread over a real engine client
that records every request's updates, so a cancel (ABORT) is told from a reply that ran out."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import httpx
import pytest

from chatpage.engine.client import ChatRequest, LocalEngineClient, RequestUpdate, UpdateCallback
from chatpage.engine.config import EngineConfig
from chatpage.serve import build_app
from chatpage.serve.threaded import serving
from chatpage.vocab import FinishReason

LONG = {"max_tokens": 900, "ignore_eos": True, "temperature": 1.0}
"""A reply far longer than the few steps the test waits for."""


class RecordingClient(LocalEngineClient):
    """A `LocalEngineClient` that keeps every update of every request, in order."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.updates: dict[str, list[RequestUpdate]] = {}

    def submit(self, request: ChatRequest, on_update: UpdateCallback) -> str:
        seen, record = _recorder(on_update)
        rid = super().submit(request, record)
        self.updates[rid] = seen
        return rid

    def submit_prompt(
        self, prompt, params, on_update: UpdateCallback, add_special_tokens=True
    ) -> str:
        seen, record = _recorder(on_update)
        rid = super().submit_prompt(prompt, params, record, add_special_tokens)
        self.updates[rid] = seen
        return rid


def _recorder(on_update: UpdateCallback) -> tuple[list[RequestUpdate], UpdateCallback]:
    """A list of every update, and the callback that adds to it before ``on_update``."""
    seen: list[RequestUpdate] = []

    def record(update: RequestUpdate) -> None:
        seen.append(update)
        on_update(update)

    return seen, record


@pytest.fixture(scope="module")
def served(tiny_llama_dir):
    client = RecordingClient(str(tiny_llama_dir), EngineConfig(kv_cache_bytes=32 << 20))
    client.start()
    try:
        assert client.wait_ready(60), client.status
        with serving(build_app(client)) as server:
            yield client, server.url
    finally:
        client.close()


async def _until(done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        await asyncio.sleep(0.01)


def _body(kind: str, n: int, stream: bool) -> dict:
    said = {"messages": [{"role": "user", "content": "Say something."}]}
    return {
        **(said if kind == "chat" else {"prompt": "Say something."}),
        **LONG,
        "n": n,
        "stream": stream,
    }


async def _leave_mid_reply(client: RecordingClient, url: str, kind: str, n: int, stream: bool):
    """Send a long request, go away once it is generating; its updates."""
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    before = set(client.updates)

    def generating() -> list[RequestUpdate] | None:
        new = [rid for rid in client.updates if rid not in before]
        seen = client.updates[new[0]] if new else []
        return seen if sum(1 for u in seen if u.usage.completion_tokens) >= 3 else None

    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        if stream:
            async with http.stream("POST", path, json=_body(kind, n, True)) as s:
                assert s.status_code == 200
                chunks = 0
                async for line in s.aiter_lines():
                    chunks += line.startswith("data: {")
                    if chunks >= 4 * n:  # three tokens each (a chat's first chunk is the role)
                        break
            # leaving the block closed the connection mid-stream
        else:
            task = asyncio.ensure_future(http.post(path, json=_body(kind, n, False)))
            await _until(lambda: generating() is not None, "the reply to start")
            task.cancel()  # httpx drops the connection of a request given up midway
            with contextlib.suppress(asyncio.CancelledError):
                await task
    updates = generating()
    assert updates is not None, "the request never generated"
    return updates


@pytest.mark.parametrize(
    ("kind", "n", "stream"),
    [
        ("chat", 1, True),
        ("chat", 3, True),
        ("chat", 1, False),
        ("chat", 3, False),
        ("completion", 2, True),
        ("completion", 1, False),
    ],
)
def test_a_client_that_goes_away_frees_its_blocks(served, kind, n, stream):
    client, url = served
    updates = asyncio.run(_leave_mid_reply(client, url, kind, n, stream))

    def freed() -> bool:
        s = client.stats()
        return s is not None and s.num_running == s.num_waiting == s.blocks_used == 0

    asyncio.run(_until(freed, "the request's blocks to be freed"))
    final = updates[-1]
    assert final.finished
    assert sorted(d.index for d in final.outputs) == list(range(n))
    assert {d.finish_reason for d in final.outputs} == {FinishReason.ABORT}  # cancelled,
    assert final.usage.completion_tokens < n * LONG["max_tokens"]  # not run to its end
