"""The chat folder's rig: `Chats` over a real engine client on the tiny random Llama, started once
a module (loading the engine is what costs; the tests' chats are their own)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from chatpage.chat.chats import Chats
from chatpage.engine.client import EngineConfig, LocalEngineClient


@pytest.fixture(scope="module")
def tiny_client(tiny_llama_dir: Path) -> Iterator[LocalEngineClient]:
    """A started client of the tiny random Llama with an 8 MiB KV cache."""
    client = LocalEngineClient(str(tiny_llama_dir), EngineConfig(kv_cache_bytes=8 << 20))
    client.start()
    assert client.wait_ready(120), client.error
    yield client
    client.close()


@pytest.fixture(scope="module")
def rig(tiny_client: LocalEngineClient) -> tuple[Chats, LocalEngineClient, queue.Queue]:
    """(chats, client, events): `Chats` over `tiny_client` whose updates wait in ``events``
    (apply them with `helpers.settle`, as the app does on its thread)."""
    events: queue.Queue = queue.Queue()
    return Chats(tiny_client, events.put), tiny_client, events
