"""The serve folder's server: `chatpage serve` on the tiny random Llama in a subprocess (what a
client really meets: its own process, a real port), started once a module; a module that needs
flags of its own (an API key, body limits) overrides ``url``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import running_server, wait_idle


@pytest.fixture(scope="module")
def url(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's base URL, once /health says ready and the personas' prompts are pinned
    (a request batched with their prefills may differ in its last bits from the same request
    alone, which tests that ask twice compare)."""
    with running_server(tiny_llama_dir, tmp_path_factory.mktemp("serve")) as base:
        wait_idle(base)
        yield base
