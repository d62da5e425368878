"""The disk tier under the prefix cache (engine/core/kv_tiers.py): a block written is read back
exactly, anything odd in a file is a miss, the folder stays within its bound (least recently used
first, over every process's files), a process killed mid-write leaves nothing a restart trips on;
and an engine restarted over the tier answers as the cold engine did, token for token, in every
architecture (sliding windows included), from disk hits and from mixes of device and disk hits."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from chatpage.engine.core.block_pool import BlockPool
from chatpage.engine.core.kv_tiers import (
    RESCAN,
    DiskTier,
    TierUsage,
    clear_tier,
    tier_usage,
)

BLOCK = 4
TOKENS = (5, 6, 7, 8)


def _tensors(num_blocks: int = 6, dtype=torch.float32) -> list[torch.Tensor]:
    """A pool's per-block tensors as a KV cache keeps them (block index first)."""
    return [torch.zeros(num_blocks, BLOCK, 2, 8, dtype=dtype) for _ in range(3)]


def _fill(tensors: list[torch.Tensor], block: int, value: float) -> None:
    for i, t in enumerate(tensors):
        t[block] = torch.arange(t[block].numel(), dtype=t.dtype).view(t[block].shape) + value + i


def _tier(root: Path, tensors, capacity: int = 1 << 30, name: str = "a") -> DiskTier:
    return DiskTier(root, {"model": name}, tensors, capacity)


def _saved(tier: DiskTier, tensors, blocks: dict[bytes, int]) -> None:
    """Save each ``key: block`` (block filled with its own values) and wait for the writes."""
    for key, block in blocks.items():
        _fill(tensors, block, 10.0 * block)
        tier.save([(block, key, TOKENS)])
    tier.flush()


def _load(tier: DiskTier, block: int, key: bytes, tokens=TOKENS) -> bool:
    """Read ``key`` back into ``block`` (as the engine's step does); whether the tier had it."""
    payload = tier.read(key, tokens)
    if payload is not None:
        tier.scatter([(block, payload)])
    return payload is not None


def _files(tier: DiskTier) -> list[Path]:
    return sorted(tier.folder.glob("*.kv"))


def _file_bytes(root: Path, tensors) -> int:
    """The size of one block's file (written under ``root``)."""
    probe = _tier(root, tensors)
    _saved(probe, tensors, {b"k0": 0})
    probe.close()
    return _files(probe)[0].stat().st_size


def test_a_block_comes_back_exactly(tmp_path):
    tensors = _tensors(dtype=torch.bfloat16)
    _fill(tensors, 1, 1.0)
    _fill(tensors, 2, 2.0)
    saved = [t[1].clone() for t in tensors]
    tier = _tier(tmp_path, tensors)
    tier.save([(1, b"k1", TOKENS)])
    tier.claim(1)  # (as the pool does before overwriting a queued block: copied for its write)
    _fill(tensors, 1, 3.0)
    tier.save([(2, b"k2", TOKENS)])
    tier.claim(2)
    assert _load(tier, 4, b"k2")  # (read back from the write queue, before the file is there)
    tier.flush()
    restarted = _tier(tmp_path, tensors)  # a new process: from the file
    assert restarted.has(b"k2") and restarted.has(b"k1")
    assert _load(restarted, 5, b"k2") and _load(restarted, 3, b"k1")
    for t, before in zip(tensors, saved, strict=True):
        assert torch.equal(t[4], t[2]) and torch.equal(t[5], t[2])
        assert torch.equal(t[3], before) and not torch.equal(t[3], t[1])
    assert restarted.stats().hits == 2 and tier.stats().writes == 2
    assert tier.audit() == [] and restarted.audit() == []
    tier.close()
    restarted.close()


def test_anything_odd_is_a_miss(tmp_path):
    tensors = _tensors()
    tier = _tier(tmp_path, tensors)
    _saved(tier, tensors, {b"good": 1, b"short": 2, b"flipped": 3})
    path = {p.stem: p for p in _files(tier)}
    data = path[b"short".hex()].read_bytes()
    path[b"short".hex()].write_bytes(data[: len(data) // 2])
    flipped = bytearray(path[b"flipped".hex()].read_bytes())
    flipped[-5] ^= 0xFF
    path[b"flipped".hex()].write_bytes(flipped)
    other = _tier(tmp_path, tensors, name="b")  # another model's namespace
    (other.folder / path[b"good".hex()].name).write_bytes(path[b"good".hex()].read_bytes())
    before = [t[0].clone() for t in tensors]
    assert not _load(tier, 0, b"good", (5, 6, 7, 9))  # other tokens
    assert not _load(tier, 0, b"short")
    assert not _load(tier, 0, b"flipped")
    assert not _load(tier, 0, b"absent")
    assert not _load(other, 0, b"good")
    path[b"good".hex()].unlink()  # another process evicted it
    assert not _load(tier, 0, b"good") and not tier.has(b"good")
    assert all(torch.equal(t[0], b) for t, b in zip(tensors, before, strict=True))
    assert tier.stats().misses == 3 and other.stats().misses == 1
    tier.close()
    other.close()


def test_the_folder_stays_within_its_bound_least_recently_used_first(tmp_path):
    tensors = _tensors()
    file_bytes = _file_bytes(tmp_path / "probe", tensors)
    tier = _tier(tmp_path, tensors, capacity=int(3.5 * file_bytes))
    _saved(tier, tensors, {b"k0": 0, b"k1": 1, b"k2": 2})
    time.sleep(0.01)
    assert _load(tier, 5, b"k0")  # read: the most recently used now
    _saved(tier, tensors, {b"k3": 3})  # 4 files > 3.5: down to 90% of the bound
    assert not tier.has(b"k1")
    assert all(tier.has(k) for k in (b"k0", b"k2", b"k3"))
    # another process's files count too, and its evictions are tolerated
    peer = _tier(tmp_path, tensors, capacity=int(3.5 * file_bytes), name="peer")
    _saved(peer, tensors, {b"p0": 0, b"p1": 1})
    usage = tier_usage(tmp_path)
    assert usage.bytes <= 3.5 * file_bytes and usage.namespaces == 2
    _saved(tier, tensors, {b"k4": 4})
    assert tier_usage(tmp_path).bytes <= 3.5 * file_bytes
    assert tier.audit() == [] and peer.audit() == []
    held = tier_usage(tmp_path).bytes
    assert clear_tier(tmp_path) == held > 0
    assert tier_usage(tmp_path) == TierUsage(0, 0, 0)
    tier.close()
    peer.close()


def test_two_processes_on_one_folder_read_each_others_blocks_and_share_the_bound(tmp_path):
    tensors = _tensors()
    file_bytes = _file_bytes(tmp_path / "probe", tensors)
    bound = 40 * file_bytes
    first, second = _tier(tmp_path, tensors, bound), _tier(tmp_path, tensors, bound)
    _saved(second, tensors, {b"late": 1})  # written after `first` listed the folder
    assert first.has(b"late") and _load(first, 5, b"late")
    assert torch.equal(tensors[0][5], tensors[0][1])
    over = 2 * int(bound * RESCAN) + file_bytes  # (each lists the folder every RESCAN it writes)
    # both write at once: first blocks of their own, each within the bound but not together;
    # then the same blocks (renamed over each other's), each evicting the other's files too
    for keys in ((range(36), range(100, 136)), (range(120), range(60, 180))):
        for mine, theirs in zip(*keys, strict=True):
            for tier, key in ((first, mine), (second, theirs)):
                tier.save([(key % 4, f"k{key}".encode(), TOKENS)])
        first.flush()
        second.flush()
        assert tier_usage(tmp_path).bytes <= bound + over
    assert first.audit() == [] and second.audit() == []
    every = [b"late", *(f"k{k}".encode() for k in range(180))]
    assert sum(_load(first, 5, key) for key in every) == len(_files(first))  # (every file whole)
    first.close()
    second.close()


def test_a_full_write_queue_drops_blocks_instead_of_growing(tmp_path):
    tensors = _tensors()
    tier = DiskTier(tmp_path, {"model": "a"}, tensors, 1 << 30, max_pending=1)
    tier.save([(0, b"k0", TOKENS)])
    tier.flush()
    stats = tier.stats()
    assert (stats.dropped, stats.writes, tier.has(b"k0")) == (1, 0, False)
    tier.close()


class _GatedWrites:
    """Holds the tier's writer inside each file write until ``gate`` opens (the race a slow
    disk makes: blocks queued, one of them being read in place, while the pool needs them)."""

    def __init__(self, tier: DiskTier) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        write = tier._write

        def gated(*args):
            self.entered.set()
            self.gate.wait()
            return write(*args)

        tier._write = gated  # type: ignore[method-assign]


def test_the_pool_never_overwrites_a_block_while_the_tier_reads_it(tmp_path):
    """Two indexed blocks go down in place while the writer is stuck in the first one's file:
    the pool evicts the other one at once (copied for its write), waits for the first until its
    write is done, and both files hold the bytes the blocks had when released."""
    tensors = _tensors(num_blocks=2)
    tier = _tier(tmp_path, tensors)
    gated = _GatedWrites(tier)
    pool = BlockPool(2, tier)
    for block, key in ((0, b"k0"), (1, b"k1")):
        assert pool.allocate() == block
        _fill(tensors, block, 10.0 * (block + 1))
        pool.register(block, key)
    released = [[t[b].clone() for t in tensors] for b in (0, 1)]
    pool.decref(0)
    pool.decref(1)
    tier.save([(0, b"k0", TOKENS), (1, b"k1", TOKENS)])
    assert gated.entered.wait(10) and tier.busy(0) and tier.busy(1)
    assert pool.allocate() == 1  # (the writer reads block 0 now: block 1 is copied and taken)
    _fill(tensors, 1, -1.0)
    got: list[int] = []
    taker = threading.Thread(target=lambda: got.append(pool.allocate()))
    taker.start()
    taker.join(0.3)
    assert taker.is_alive() and not got  # block 0 is being written: the pool waits
    gated.gate.set()
    taker.join(10)
    assert got == [0] and not tier.busy(0)
    _fill(tensors, 0, -2.0)
    tier.flush()
    for block, key in ((0, b"k0"), (1, b"k1")):
        assert _load(tier, block, key)
        assert all(torch.equal(t[block], r) for t, r in zip(tensors, released[block], strict=True))
    assert tier.stats().claimed == 1 and tier.stats().writes == 2 and tier.audit() == []
    tier.close()


WRITER = """
import sys, torch
from pathlib import Path
from chatpage.engine.core.kv_tiers import DiskTier
tensors = [torch.zeros(2, 256, 64, 64) for _ in range(4)]  # 16 MiB blocks: writes take a while
tier = DiskTier(Path(sys.argv[1]), {"model": "a"}, tensors, 1 << 40)
i = 0
while True:
    for t in tensors:
        t[0].fill_(float(i))
    tier.save([(0, i.to_bytes(4, "little"), (i, i + 1))])
    tier.flush()
    i += 1
"""


@pytest.mark.slow
def test_a_process_killed_mid_write_leaves_a_folder_that_loads_cleanly(tmp_path):
    root = tmp_path / "kv"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(root)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            names = [p.name for p in root.glob("*/*")]
            if sum(n.endswith(".kv") for n in names) >= 2 and any(
                n.endswith(".tmp") for n in names
            ):
                break
            time.sleep(0.002)
        else:
            pytest.fail("the writer never had a block in flight")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    assert list(root.glob("*/*.tmp"))  # killed while writing one
    tensors = [torch.zeros(2, 256, 64, 64) for _ in range(4)]
    tier = DiskTier(root, {"model": "a"}, tensors, 1 << 40)  # the restart
    assert not list(root.glob("*/*.tmp"))  # its writer is gone: removed
    written = [int.from_bytes(bytes.fromhex(p.stem), "little") for p in _files(tier)]
    assert len(written) >= 2
    for i in written:
        assert _load(tier, 1, i.to_bytes(4, "little"), (i, i + 1))
        assert all(bool((t[1] == float(i)).all()) for t in tensors)
    assert tier.audit() == []
    tier.close()


# -- an engine restarted over the tier -----------------------------------------------------------
def _engine(path: Path, kv: Path, **config):
    from chatpage.engine import EngineConfig, LLMEngine

    return LLMEngine.from_pretrained(
        str(path),
        EngineConfig(
            **{"block_size": 8, "kv_disk_bytes": 1 << 30, "kv_disk_dir": str(kv), **config}
        ),
        progress=lambda _m: None,
    )


def _greedy(engine, prompts: list[list[int]]) -> list[list[int]]:
    from chatpage.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    return [o.outputs[0].token_ids for o in engine.generate(prompts, params)]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["llama3", "qwen2.5", "qwen3", "mistral", "ministral", "gemma2", "gemma3", "phi3"]
)
def test_a_restarted_engine_answers_from_disk_as_the_cold_one(kind, tmp_path, tokenizer_dir):
    """Turn 1 cold, turn 2 over its blocks (written as turn 1 ended); restarted, turn 1 comes
    from disk alone, turn 2 from the device (turn 1's, just read) and disk (the rest); a third
    engine with a pool of a few blocks reads both while evicting; each as the cold one."""
    from test_architectures import _tiny_dir

    path, hf = _tiny_dir(kind, tmp_path, tokenizer_dir)
    rng = random.Random(7)
    vocab = hf.config.vocab_size
    turn1 = [rng.randrange(3, vocab) for _ in range(45)]
    kv = tmp_path / "kv"
    cold = _engine(path, kv)
    first = _greedy(cold, [turn1])[0]
    turn2 = turn1 + first + [rng.randrange(3, vocab) for _ in range(20)]
    second = _greedy(cold, [turn2])[0]
    cold.close()
    assert cold.bm.tier_hit_tokens == 0 and cold.tier is not None
    assert cold.tier.stats().writes >= len(turn2) // 8

    warm = _engine(path, kv)
    assert _greedy(warm, [turn1])[0] == first
    assert warm.bm.tier_hit_tokens == 40  # every full block but the one holding the last token
    on_disk = warm.bm.tier_hit_tokens
    assert _greedy(warm, [turn2])[0] == second
    assert warm.bm.tier_hit_tokens > on_disk  # turn 2's own blocks came from disk
    assert warm.bm.audit() == []
    warm.close()

    m = warm.model
    block_bytes = 2 * m.kv_groups.page_layers * 8 * m.num_kv_heads * m.head_dim * 4
    small = _engine(path, kv, kv_cache_bytes=14 * m.kv_groups.num_groups * block_bytes)
    assert _greedy(small, [turn2, turn1]) == [second, first]
    assert small.bm.tier_hit_tokens > 0 and small.bm.audit() == []
    small.close()


@pytest.mark.slow
def test_blocks_taken_back_while_going_down_reach_disk_as_they_were(tiny_llama_dir, tmp_path):
    """A slow disk and a pool too small for two prompts: the second prompt's allocation evicts
    the first one's blocks while they wait for their writes (or are being written). Each file
    holds the bytes its block had when released, and a restarted engine answers from them as
    the cold engine did."""
    from chatpage.engine.core.block_pool import extend_hashes
    from chatpage.engine.core.block_table import group_key

    first = [3 + (7 * i) % 200 for i in range(45)]
    other = [5 + (11 * i) % 190 for i in range(88)]
    probe = _engine(tiny_llama_dir, tmp_path / "none", kv_disk_bytes=0)
    cold = _greedy(probe, [first])[0]
    engine = _engine(tiny_llama_dir, tmp_path / "kv", kv_cache_bytes=12 * probe.block_bytes)
    assert engine.tier is not None and engine.bm.pool.num_blocks == 12
    tier = engine.tier
    write = tier._write

    def slow(*args):
        time.sleep(0.2)
        return write(*args)

    tier._write = slow  # type: ignore[method-assign]
    assert _greedy(engine, [first])[0] == cold
    tokens = (first + cold)[:48]
    keys = [group_key(0, h) for h in extend_hashes([], tokens, 8)]
    pool = engine.bm.pool
    released = {
        k: torch.cat([t[pool.lookup(k)].reshape(-1).view(torch.uint8) for t in tier._tensors])
        for k in keys
    }
    _greedy(engine, [other])  # (needs every block: evicts the queued ones)
    assert all(pool.lookup(k) is None for k in keys) and tier.stats().claimed > 0
    tier.flush()
    for i, k in enumerate(keys):
        assert torch.equal(tier.read(k, tuple(tokens[i * 8 : (i + 1) * 8])), released[k])
    assert engine.bm.audit() == []
    engine.close()
    warm = _engine(tiny_llama_dir, tmp_path / "kv")
    assert _greedy(warm, [first])[0] == cold and warm.bm.tier_hit_tokens == 40
    warm.close()


class _ReadsAhead:
    """Lets the tier's reading thread read ``passed`` blocks ahead, then holds it until
    ``gate`` opens (a slow disk, half-way through a request's blocks)."""

    def __init__(self, tier: DiskTier, passed: int) -> None:
        self.gate = threading.Event()
        self.held = threading.Event()
        self.count = 0
        read = tier._read

        def gated(*args):
            if threading.current_thread() is tier._reader:
                if self.count >= passed:
                    self.held.set()
                    self.gate.wait()
                self.count += 1
            return read(*args)

        tier._read = gated  # type: ignore[method-assign]


def _finish(engine, rid: str) -> list[int]:
    """Step ``engine`` until request ``rid`` ends; its tokens."""
    from chatpage.engine.accumulator import OutputAccumulator

    outputs = OutputAccumulator()
    while True:
        for update in engine.step():
            if update.request_id == rid and (out := outputs.add(update)).finished:
                return out.outputs[0].token_ids


@pytest.mark.slow
def test_disk_hits_read_ahead_wholly_half_or_not_answer_as_the_cold_engine(
    tiny_llama_dir, tmp_path
):
    """A restarted engine's request whose blocks were all read ahead, half of them (the rest
    read in the step that admits it) or none (read ahead off: the CPU's default) answers as the
    cold engine; one added while another runs waits for its reads, stepping the other
    meanwhile."""
    from chatpage.engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = [3 + (5 * i) % 211 for i in range(8 * 10 + 3)]
    kv = tmp_path / "kv"
    cold = _engine(tiny_llama_dir, kv)
    expected = _greedy(cold, [prompt])[0]
    cold.close()
    for ahead, passed in ((True, 10), (True, 4), (None, 0)):
        engine = _engine(tiny_llama_dir, kv, kv_disk_prefetch=ahead)
        reads = _ReadsAhead(engine.tier, passed)
        rid = engine.add_request(prompt, params)
        if passed == 10:
            engine.tier.flush()  # (all of them arrived)
        elif ahead:
            assert reads.held.wait(30)  # (the first ``passed`` arrived, the rest are held)
        assert _finish(engine, rid) == expected
        assert engine.tier.stats().prefetched == passed and engine.bm.tier_hit_tokens == 80
        assert engine.bm.audit() == []
        reads.gate.set()
        engine.close()

    engine = _engine(tiny_llama_dir, kv, kv_disk_prefetch=True)
    reads = _ReadsAhead(engine.tier, 0)
    other = engine.add_request(list(range(300, 340)), SamplingParams(temperature=0, max_tokens=8))
    engine.step()
    rid = engine.add_request(prompt, params)
    for _ in range(3):
        engine.step()
        assert not engine.groups[rid].started  # (its blocks are still being read)
    reads.gate.set()
    engine.tier.flush()
    assert _finish(engine, rid) == expected and engine.tier.stats().prefetched == 10
    if other in engine.groups:
        _finish(engine, other)
    assert engine.bm.audit() == []
    engine.close()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from model_dirs import offline_tokenizer_dir

    return offline_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.mark.slow
def test_a_pinned_prefix_comes_from_disk_and_another_format_never_reads_it(
    tiny_llama_dir, tmp_path
):
    kv = tmp_path / "kv"
    prefix = list(range(3, 3 + 8 * 12 + 5))
    cold = _engine(tiny_llama_dir, kv)
    cold.pin_prefix(prefix)
    _greedy(cold, [prefix + [9, 9]])  # (runs the pin with it)
    cold.close()
    assert cold.stats().blocks_pinned == 12
    warm = _engine(tiny_llama_dir, kv)
    warm.pin_prefix(prefix)
    assert not warm.has_unfinished()  # pinned at once, from disk: no prefill step
    assert warm.bm.tier_hit_tokens == 12 * 8  # every full block of the persona
    assert warm.stats().blocks_pinned == 12
    _greedy(warm, [prefix + [9, 9]])
    assert warm.stats().prefix_hit_tokens == 2 * 12 * 8 and warm.bm.audit() == []
    warm.close()
    other = _engine(tiny_llama_dir, kv, block_size=16)  # another KV format: another namespace
    other.pin_prefix(prefix)
    _greedy(other, [prefix + [9, 9]])
    assert other.bm.tier_hit_tokens == 0 and other.stats().blocks_pinned == 6
    other.close()
    assert tier_usage(kv).namespaces == 2


TOOLS_TEMPLATE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Reads a file of the project and returns its text, line by line.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for i in range(4)
]


@pytest.mark.slow
@pytest.mark.parametrize("renders_tools", [True, False])
def test_a_tool_using_personas_pin_holds_its_tools_and_comes_from_disk(
    renders_tools, tiny_llama_dir, tmp_path
):
    """The persona's pin with the tools its chats offer is their prompt's real prefix (the
    template's rendering of them, or chatpage's listing in the system prompt for a template
    that renders none): computed by the first process, read back from disk by the next, never
    computed again."""
    import json
    import shutil

    from chatpage.engine.client import EngineConfig, LocalEngineClient, chat_ids, persona_prefix
    from chatpage.engine.text.chat_template import system_prefix

    model = tmp_path / "tools-model"
    shutil.copytree(tiny_llama_dir, model)
    if renders_tools:
        config = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": TOOLS_TEMPLATE})
        )
        (model / "chat_template.jinja").unlink(missing_ok=True)
    system = "You are tiny. You read files."
    engine_config = EngineConfig(block_size=8, kv_disk_bytes=1 << 30, kv_disk_dir=str(tmp_path))
    pinned = []
    for _ in range(2):
        client = LocalEngineClient(str(model), engine_config)
        client.start()
        assert client.wait_ready(120), client.error
        tok = client.engine.tokenizer
        prefix = persona_prefix(tok, system, TOOLS)
        assert len(prefix) > len(system_prefix(tok, system)) + 8 * 8
        chat = [{"role": "system", "content": system}, {"role": "user", "content": "Hi."}]
        assert chat_ids(tok, chat, TOOLS)[: len(prefix)] == prefix
        client.pin_system_prompt(system, TOOLS)
        deadline = time.monotonic() + 60
        while client.stats().blocks_pinned < len(prefix) // 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        pinned.append(client.stats())
        client.close()
    cold, warm = pinned
    assert cold.blocks_pinned == warm.blocks_pinned == len(prefix) // 8
    assert cold.disk_hit_tokens == 0 and warm.disk_hit_tokens == len(prefix) // 8 * 8


@pytest.mark.slow
def test_an_int8_kv_cache_goes_down_and_comes_back(tiny_llama_dir, tmp_path):
    """int8 blocks (rows with their scales) are read back byte for byte: the same greedy
    tokens, in a namespace of their own (a bf16 engine over the folder reads none of them)."""
    prompt = list(range(100, 100 + 8 * 9 + 3))
    outs, hits = [], []
    for dtype in ("int8", "int8", "bf16"):
        engine = _engine(tiny_llama_dir, tmp_path, kv_cache_dtype=dtype)
        outs.append(_greedy(engine, [prompt])[0])
        hits.append(engine.bm.tier_hit_tokens)
        assert engine.bm.audit() == []
        engine.close()
    assert outs[0] == outs[1] and hits == [0, 9 * 8, 0]
