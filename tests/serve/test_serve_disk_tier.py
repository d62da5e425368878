"""Two real `chatpage serve` processes on one KV disk-tier folder: what one writes the other reads
back, while both write (and evict, and rename over each other's files) at once."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from serve_helpers import metrics, running_server

from chatpage.engine.core.kv_tiers import RESCAN, tier_usage

# the shared folder's kv_disk: under two thirds of what the racing prompts' distinct blocks take
# (16 prompts of 12 full blocks), so the folder overflows however the two servers split the writes
# (one skips a block the other has on disk already)
BOUND = 3 << 19
LIMIT = BOUND * (1 + 2 * RESCAN)  # (two processes writing at once: kv_tiers.RESCAN)


def complete(url: str, prompt: list[int]) -> dict:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json()


def settled_writes(url: str) -> float:
    """The server's disk writes once its write queue has stopped growing them."""
    last, deadline = -1.0, time.monotonic() + 60
    while time.monotonic() < deadline:
        now = metrics(url)["chatpage:kv_disk_writes"]
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise AssertionError("the disk tier's writes never settled")


@pytest.mark.slow
def test_two_serves_share_one_folder_while_both_write(tiny_llama_dir, tmp_path, monkeypatch):
    kv = tmp_path / "kv"
    monkeypatch.setenv("CHATPAGE_KV_DIR", str(kv))
    extra = ("--kv-disk", f"{BOUND}")
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
    rng = random.Random(42)
    prompts = [[rng.randrange(100, 1000) for _ in range(200)] for _ in range(16)]
    asked = rng.sample(range(100, 1000), 300)  # the prompt one writes and the other reads
    with (
        running_server(tiny_llama_dir, homes[0], extra=extra) as a,
        running_server(tiny_llama_dir, homes[1], extra=extra) as b,
    ):
        # both write at once: a prompt each to both servers, so each writes what the other
        # writes too (the same files renamed over each other) and the folder overflows its
        # bound (whichever evicts drops the other's files as well)
        with ThreadPoolExecutor(8) as pool:
            raced = list(
                pool.map(complete, [a, b] * len(prompts), [p for p in prompts for _ in "ab"])
            )
        assert all(r["choices"][0]["text"] for r in raced)  # (batches differ: texts may too)
        written = settled_writes(a) + settled_writes(b)
        usage = tier_usage(kv)
        assert written * usage.bytes / usage.files > 1.5 * BOUND  # (so they evicted)
        assert usage.bytes <= LIMIT

        cold = complete(a, asked)  # computed by a, its blocks written when the turn ends
        settled_writes(a)
        hits_before = metrics(b)["chatpage:prefix_cache_hits_disk"]
        warm = complete(b, asked)
        assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= 256 > cold["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert metrics(b)["chatpage:prefix_cache_hits_disk"] - hits_before >= 16
        assert tier_usage(kv).bytes <= LIMIT
    for log in Path(tmp_path).glob("*/server-*.log"):
        assert "Traceback" not in log.read_text(), log.read_text()
