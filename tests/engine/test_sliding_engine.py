"""The engine over a model with sliding-window layers (a tiny random hybrid: one full-attention
layer, one sliding): freeing the blocks that left the window changes nothing in the output, which
is transformers' own, with preemption under a small KV budget and a prefix hit."""

from __future__ import annotations

import random

import pytest
import torch

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams

WINDOW = 20
PROMPT_LENS = (70, 45, 33)
MAX_NEW = 24


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in PROMPT_LENS]


def _run(path, **config) -> tuple[list[list[int]], LLMEngine]:
    engine = LLMEngine.from_pretrained(
        str(path), EngineConfig(max_num_batched_tokens=32, **config), progress=lambda _m: None
    )
    outs = engine.generate(_prompts(), SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert engine.bm.audit() == []
    return [o.outputs[0].token_ids for o in outs], engine


@pytest.mark.slow  # transformers' reference
@torch.inference_mode()
def test_freeing_outside_the_window_keeps_transformers_output(hybrid_dir):
    path, hf = hybrid_dir
    want = []
    for prompt in _prompts():
        ids = torch.tensor([prompt])
        out = hf.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False
        )
        want.append(out[0, len(prompt) :].tolist())
    kept, engine_kept = _run(path, free_outside_window=False)
    freed, engine = _run(path)
    assert engine.bm.windows == (0, WINDOW) and engine_kept.bm.windows == (0, 0)
    assert freed == kept == want
    # a small budget: preemption (recompute and swap) with the sliding group's blocks released
    small, tight = _run(path, kv_cache_bytes=14 * engine.block_bytes)
    assert small == want
    assert tight.stats().preemptions_recompute + tight.stats().preemptions_swap > 0
    # a prefix hit: the cached turn's blocks (full group: all, sliding: its window's) reused
    prompt = _prompts()[0]
    turn = prompt + want[0]
    before = engine.bm.prefix_hit_tokens
    again = engine.generate([turn + [5]], SamplingParams(temperature=0, max_tokens=4))[0]
    assert engine.bm.prefix_hit_tokens - before >= 16 * (len(turn) // 16) - 16
    ids = torch.tensor([turn + [5]])
    ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False)
    assert again.outputs[0].token_ids == ref[0, len(turn) + 1 :].tolist()
    assert engine.bm.audit() == []
