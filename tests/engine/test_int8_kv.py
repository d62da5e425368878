"""The engine over an int8 KV cache (``--kv-cache-dtype int8``): the native kernels give the torch
reference's greedy tokens on several architectures (a sliding-window hybrid included), swaps,
copy-on-write forks and prefix hits carry int8 blocks intact, the pool counts the blocks' true
bytes, and a model whose values int8 cannot hold is refused with one line."""

from __future__ import annotations

import random

import pytest
import torch
from model_dirs import tiny_model_dir

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.load.loader import ModelLoadError
from chatpage.engine.model import ops
from chatpage.engine.model.kv_cache import bytes_per_block

MAX_NEW = 12
PROMPT_LENS = (1, 17, 70, 150)


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in PROMPT_LENS]


def _engine(path, **config) -> LLMEngine:
    config.setdefault("kv_cache_bytes", 16 << 20)
    return LLMEngine.from_pretrained(str(path), EngineConfig(**config), progress=lambda _m: None)


def _tokens(engine: LLMEngine, prompts, params: SamplingParams) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in engine.generate(prompts, params)]


def _first_then_rest(engine: LLMEngine, prompts, params: SamplingParams) -> list:
    """The first prompt alone, then the others (which find its blocks in the prefix cache)."""
    return _tokens(engine, prompts[:1], params) + _tokens(engine, prompts[1:], params)


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def models(tiny_llama_dir, tiny_qwen2_dir, hybrid_dir):
    return {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir, "hybrid": hybrid_dir[0]}


@pytest.mark.slow  # two engines per architecture
@pytest.mark.parametrize("kind", ["llama", "qwen2", "hybrid"])
def test_int8_greedy_is_the_references(kind, models, monkeypatch):
    """Chunked prefill, decode and (hybrid) a sliding window over int8 rows: the native kernels'
    greedy tokens are the torch reference's, and the engine measured int8 acceptable first."""
    config = {"kv_cache_dtype": "int8", "max_num_batched_tokens": 64}
    engine = _engine(models[kind], **config)
    assert engine.kv.k[0].dtype == torch.int8 and engine.int8_kv_loss.acceptable
    ours = _tokens(engine, _prompts(), GREEDY)
    monkeypatch.setattr(ops, "available", lambda device: False)
    assert _tokens(_engine(models[kind], **config), _prompts(), GREEDY) == ours


@pytest.mark.slow  # two engines
def test_swaps_forks_and_prefix_hits_carry_int8_blocks(tiny_llama_dir):
    """Two samples of each prompt (copy-on-write of the shared last block), a pool too small for
    the batch (swap preemption) and prompts sharing a prefix: the tokens of a pool that holds
    everything."""
    rng = random.Random(5)
    shared = [rng.randrange(3, 49152) for _ in range(40)]
    prompts = [shared + p for p in _prompts(1)]
    params = SamplingParams(temperature=0.9, n=2, seed=11, max_tokens=MAX_NEW, ignore_eos=True)
    want = _first_then_rest(_engine(tiny_llama_dir, kv_cache_dtype="int8"), prompts, params)
    block = bytes_per_block(2, 16, 2, 64, torch.int8)
    small = _engine(
        tiny_llama_dir, kv_cache_dtype="int8", kv_cache_bytes=20 * block, preemption_mode="swap"
    )
    assert _first_then_rest(small, prompts, params) == want
    stats = small.stats()
    assert stats.preemptions_swap > 0 and stats.prefix_hit_tokens > 0
    assert stats.blocks_swapped == 0 and stats.blocks_used == stats.blocks_pinned


def test_the_pool_counts_int8_blocks_as_they_are(tiny_llama_dir):
    """An int8 block's bytes are its tensors' (values and scales), so the same budget holds
    1.9x the blocks of bf16; the two formats never name their KV bytes alike."""
    engines = {d: _engine(tiny_llama_dir, kv_cache_dtype=d) for d in ("bf16", "int8")}
    for engine in engines.values():
        held = sum(t[0].nbytes for t in engine.kv.block_tensors())
        assert engine.block_bytes == held == engine.stats().bytes_per_block
        assert engine.stats().num_blocks == (16 << 20) // held
    bf16, int8 = engines["bf16"], engines["int8"]
    assert int8.stats().num_blocks >= 1.9 * bf16.stats().num_blocks
    assert int8.kv.format != bf16.kv.format and int8.kv.format.dtype == "int8"
    assert int8.kv.cpu_k[0].dtype == torch.int8 and int8.kv.cpu_k[0].shape[1:] == (16, 2, 66)


@pytest.fixture(scope="module")
def outlier_dir(tmp_path_factory, default_model_dir):
    """A tiny Llama whose value channel 0 of every KV head is 10^4 times the others and unused
    by the output projection: bf16 KV holds the rest, one int8 scale per row cannot."""
    from transformers import LlamaForCausalLM

    path = tiny_model_dir("llama", tmp_path_factory.mktemp("models"), default_model_dir)
    model = LlamaForCausalLM.from_pretrained(path)
    config = model.config
    dim = config.hidden_size // config.num_attention_heads
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.v_proj.weight[::dim] *= 1e4
            layer.self_attn.o_proj.weight[:, ::dim] = 0
    model.save_pretrained(path)
    return path


def test_a_model_int8_kv_cannot_hold_is_refused(outlier_dir):
    with pytest.raises(
        ModelLoadError, match=r"an int8 KV cache loses too much.*--kv-cache-dtype bf16"
    ):
        _engine(outlier_dir, kv_cache_dtype="int8")
    assert _engine(outlier_dir, kv_cache_dtype="bf16").kv.k[0].dtype == torch.bfloat16
