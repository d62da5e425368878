"""Parallel sampling (n) and beam search on copy-on-write forks, against references in the test."""

from __future__ import annotations

import random

import pytest
import torch
from model_dirs import reference_model

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.text.chat_template import render_prompt

BLOCK_BYTES_TINY = 16 * 2 * 2 * 2 * 64 * 4  # tiny Llama: 2 layers, 2 KV heads, head dim 64, fp32


def _engine(path, **config) -> LLMEngine:
    config.setdefault("kv_cache_bytes", 32 << 20)
    return LLMEngine.from_pretrained(
        str(path) if path else None, EngineConfig(**config), progress=lambda _m: None
    )


@torch.inference_mode()
def reference_beam_search(hf, prompt, width, max_tokens, stop_ids, length_penalty=1.0):
    """Plain beam search over transformers' logits (its own KV cache, reordered by parent).

    Each step scores every continuation of every live beam, walks the 2*width best: one ending in
    a stop token becomes a finished hypothesis if it ranks within the first width; the others
    refill the beams up to width. Done at max_tokens (live beams become hypotheses) or when
    width hypotheses exist and none of the live beams can beat the worst of them.
    """
    out = hf(torch.tensor([prompt]), use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]
    beams = [([], 0.0)]
    hyps: list[tuple[float, list[int], float]] = []

    def add(tokens, cum, length):
        hyps.append((cum / length**length_penalty, tokens, cum))
        hyps.sort(key=lambda h: -h[0])
        del hyps[width:]

    for step in range(1, max_tokens + 1):
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        scores = logprobs + torch.tensor([c for _, c in beams]).unsqueeze(1)
        values, flat = torch.topk(scores.flatten(), 2 * width)
        vocab = scores.shape[1]
        live, parents = [], []
        for rank, (v, f) in enumerate(zip(values.tolist(), flat.tolist(), strict=True)):
            b, tok = f // vocab, f % vocab
            if tok in stop_ids:
                if rank < width:
                    add(beams[b][0] + [tok], v, step)
            else:
                live.append((beams[b][0] + [tok], v))
                parents.append(b)
            if len(live) == width:
                break
        beams = live
        if step == max_tokens:
            for toks, cum in beams:
                add(toks, cum, step)
            break
        if len(hyps) >= width:
            best_live = max(c / step**length_penalty for _, c in beams)
            if hyps[-1][0] >= best_live:
                break
        cache.reorder_cache(torch.tensor(parents))
        out = hf(torch.tensor([[toks[-1]] for toks, _ in beams]), cache=cache, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1]
    return [(toks, cum, score) for score, toks, cum in hyps]


def _assert_beams_equal(ours, ref):
    assert [c.token_ids for c in ours.outputs] == [toks for toks, _, _ in ref]
    for c, (_, cum, score) in zip(ours.outputs, ref, strict=True):
        assert c.cumulative_logprob == pytest.approx(cum, abs=1e-4)
        assert c.score == pytest.approx(score, abs=1e-4)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return _engine(tiny_llama_dir)


PROMPT = [random.Random(3).randrange(3, 49152) for _ in range(37)]


@pytest.mark.parametrize("width", [2, 3, 4, 5, 6])
def test_beam_search_equals_reference_tiny(width, tiny, tiny_hf):
    ref = reference_beam_search(tiny_hf, PROMPT, width, 10, {2})
    out = tiny.generate([PROMPT], SamplingParams(beam_width=width, max_tokens=10))[0]
    _assert_beams_equal(out, ref)
    assert all(c.finish_reason == "length" for c in out.outputs)  # random weights: no EOS


@pytest.mark.parametrize("width", [2, 4, 6])
def test_beam_search_with_stop_token_reached_tiny(width, tiny, tiny_hf):
    greedy = tiny.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4))[0]
    stop = greedy.outputs[0].token_ids[2]  # a token the beams are bound to meet
    ref = reference_beam_search(tiny_hf, PROMPT, width, 12, {2, stop}, length_penalty=0.5)
    out = tiny.generate(
        [PROMPT],
        SamplingParams(beam_width=width, max_tokens=12, stop_token_ids=[stop], length_penalty=0.5),
    )[0]
    _assert_beams_equal(out, ref)
    assert any(c.token_ids[-1] == stop for c in out.outputs)
    assert tiny.stats().blocks_used == 0


@pytest.fixture(scope="module")
def smol(default_model_dir):
    return _engine(None, kv_cache_bytes=256 << 20), reference_model(default_model_dir)


@pytest.mark.parametrize("width", [2, 3, 4, 5, 6])
@pytest.mark.slow  # the real default model (the module's smol engine)
def test_beam_search_equals_reference_default_model(width, smol):
    engine, hf = smol
    prompt = render_prompt(engine.tokenizer, [{"role": "user", "content": "What is 2+2?"}])
    ref = reference_beam_search(hf, prompt, width, 24, {2})
    out = engine.generate([prompt], SamplingParams(beam_width=width, max_tokens=24))[0]
    _assert_beams_equal(out, ref)
    assert out.outputs[-1].text.startswith("2 + 2 = 4")
    # "2 + 2 = 4" then EOS is among the kept hypotheses
    assert any(c.finish_reason == "stop" and c.token_ids[-1] == 2 for c in out.outputs)


# -- parallel sampling --------------------------------------------------------------------------------
def test_n_samples_reproducible_and_batch_independent(tiny):
    params = SamplingParams(n=3, temperature=1.0, top_p=0.9, seed=11, max_tokens=8)
    alone = tiny.generate([PROMPT], params)[0]
    mixed = tiny.generate(
        [PROMPT[:5], PROMPT, PROMPT[3:20]],
        [
            SamplingParams(temperature=0.7, max_tokens=5),
            params,
            SamplingParams(beam_width=3, max_tokens=6),
        ],
    )[1]
    assert [c.token_ids for c in alone.outputs] == [c.token_ids for c in mixed.outputs]
    assert [c.index for c in alone.outputs] == [0, 1, 2]
    assert len({tuple(c.token_ids) for c in alone.outputs}) > 1  # the samples differ
    other_seed = tiny.generate(
        [PROMPT], SamplingParams(n=3, temperature=1.0, seed=12, max_tokens=8)
    )[0]
    assert [c.token_ids for c in other_seed.outputs] != [c.token_ids for c in alone.outputs]


def test_n_samples_at_temperature_zero_equal_greedy(tiny):
    greedy = tiny.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8))[0]
    many = tiny.generate([PROMPT], SamplingParams(n=4, temperature=0, max_tokens=8))[0]
    assert [c.token_ids for c in many.outputs] == [greedy.outputs[0].token_ids] * 4


@torch.inference_mode()
def test_forked_samples_never_see_a_siblings_writes(tiny, tiny_hf):
    """Each sample's per-token logprobs equal transformers' on that sample's own tokens."""
    out = tiny.generate(
        [PROMPT], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=20, logprobs=True)
    )[0]
    for c in out.outputs:
        ids = torch.tensor([PROMPT + c.token_ids])
        lp = torch.log_softmax(tiny_hf(ids).logits[0].float(), dim=-1)
        expected = [float(lp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(c.token_ids)]
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_n_samples_share_prompt_blocks(tiny):
    prompt = [random.Random(9).randrange(3, 49152) for _ in range(200)]

    def blocks_after(params, generated):
        rid = tiny.add_request(prompt, params)
        while True:
            outs = [u for u in tiny.step() if u.request_id == rid]
            if outs and outs[0].usage.completion_tokens >= generated * params.n:
                used = tiny.stats().blocks_used
                tiny.abort(rid)
                return used

    single = blocks_after(SamplingParams(temperature=1.0, seed=1, max_tokens=50), 8)
    four = blocks_after(SamplingParams(n=4, temperature=1.0, seed=1, max_tokens=50), 8)
    assert single == 13  # 200 + 8 tokens
    assert four < 1.3 * single  # 12 shared prompt blocks + 4 private copies of the partial one
    assert tiny.stats().blocks_used == 0


def test_mixed_batch_each_request_equals_its_run_alone(tiny):
    prompts = [PROMPT, PROMPT[:9], PROMPT[5:30], PROMPT[:21]]
    params = [
        SamplingParams(temperature=0, max_tokens=7),
        SamplingParams(temperature=0.9, seed=3, max_tokens=7),
        SamplingParams(n=3, temperature=0.8, seed=4, max_tokens=7),
        SamplingParams(beam_width=4, max_tokens=7),
    ]
    together = tiny.generate(prompts, params)
    for prompt, p, out in zip(prompts, params, together, strict=True):
        alone = tiny.generate([prompt], p)[0]
        assert [c.token_ids for c in out.outputs] == [c.token_ids for c in alone.outputs]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_preempted_groups_resume_exactly(mode, tiny_llama_dir):
    prompts = [PROMPT, PROMPT[:30], PROMPT[4:], PROMPT[:33]]
    params = [
        SamplingParams(beam_width=4, max_tokens=24),
        SamplingParams(n=4, temperature=1.0, seed=8, max_tokens=24),
        SamplingParams(beam_width=3, max_tokens=24),
        SamplingParams(n=3, temperature=0.8, seed=9, max_tokens=24),
    ]
    # groups of several sequences swap while there is swap space: none forces recompute. A
    # recompute prefills the generated tokens again, whose keys and values decode steps computed:
    # steps of at most 16 rows everywhere (chunked prefill) keep every fp32 matmul on the GEMV, so
    # both computations round alike (sgemm's sums differ in the last bits on some CPUs, which a
    # sampled token at temperature 1 can turn into another token)
    # A fresh reference: the module's engine has these prompts cached by earlier tests, and a
    # prompt tail of at most 16 rows runs attention row by row (csrc/cpu/attention.cpp, for
    # speculative decoding's exactness), not in the cold prefill's tiles.
    same_kernels = {} if mode == "swap" else {"swap_space_bytes": 0, "max_num_batched_tokens": 16}
    reference = _engine(
        tiny_llama_dir, **({} if mode == "swap" else {"max_num_batched_tokens": 16})
    )
    expected = reference.generate(prompts, params)
    small = _engine(
        tiny_llama_dir, kv_cache_bytes=24 * BLOCK_BYTES_TINY, preemption_mode=mode, **same_kernels
    )
    got = small.generate(prompts, params)
    s = small.stats()
    assert (s.preemptions_swap if mode == "swap" else s.preemptions_recompute) > 0
    for a, b in zip(expected, got, strict=True):
        assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert x.cumulative_logprob == pytest.approx(y.cumulative_logprob, abs=1e-4)
    assert s.blocks_used == 0 and s.blocks_swapped == 0


def test_abort_mid_beam_and_mid_samples_frees_everything(tiny):
    a = tiny.add_request(PROMPT, SamplingParams(beam_width=5, max_tokens=40))
    b = tiny.add_request(PROMPT[:20], SamplingParams(n=4, temperature=1.0, max_tokens=40))
    for _ in range(6):
        tiny.step()
    s = tiny.stats()
    assert s.blocks_shared > 0 and s.logical_blocks > s.blocks_used
    tiny.abort(a)
    tiny.abort(b)
    s = tiny.stats()
    assert s.blocks_used == 0 and s.num_running == 0 and s.logical_blocks == 0
