"""The engine against transformers: greedy output token-identical on the same fp32 weights.

Tiny random Llama and Qwen2 models (fast, many prompts) and the real default model (a few chats);
the same equivalence with preemption (recompute and swap) and with prefix caching.
"""

from __future__ import annotations

import random

import pytest
import torch
from model_dirs import reference_model

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.text.chat_template import render_prompt

MAX_NEW = 12
PROMPT_LENS = [1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 150, 211, 256, 300]


def _prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 49152) for _ in range(n)] for n in PROMPT_LENS]


@torch.inference_mode()
def _hf_greedy(hf, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        do_sample=False,
        pad_token_id=2,
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def _assert_same_or_near_tie(hf, prompt: list[int], ours: list[int], theirs: list[int]) -> None:
    """Equal, or they split at a near-tie (top-2 logit gap < 1e-4) that the test verifies."""
    if ours == theirs:
        return
    i = next(
        (j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    assert i < min(len(ours), len(theirs)), f"lengths differ without a token split: {ours} {theirs}"
    logits = hf(torch.tensor([prompt + theirs[:i]])).logits[0, -1]
    top2 = torch.topk(logits, 2).values
    gap = float(top2[0] - top2[1])
    assert gap < 1e-4, f"outputs differ at token {i} where the top-2 gap is {gap:.2e}"


@pytest.fixture(scope="module")
def tiny_models(tiny_llama_dir, tiny_qwen2_dir):
    return {"llama": tiny_llama_dir, "qwen2": tiny_qwen2_dir}


@pytest.fixture(scope="module")
def hf_reference(tiny_models):
    """transformers' greedy continuation of every prompt, per tiny model (computed once)."""
    refs = {}
    for kind, path in tiny_models.items():
        hf = reference_model(path)
        refs[kind] = (hf, [_hf_greedy(hf, p, MAX_NEW) for p in _prompts()])
    return refs


def _run(path, config: EngineConfig, prompts, max_new=MAX_NEW):
    engine = LLMEngine.from_pretrained(str(path), config, progress=lambda _m: None)
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=max_new))
    return engine, [o.outputs[0].token_ids for o in outs]


def _assert_no_leak(engine: LLMEngine) -> None:
    s = engine.stats()
    assert s.blocks_used == s.blocks_pinned, "blocks still held after every request finished"
    assert s.blocks_swapped == 0
    assert s.blocks_free + s.blocks_cached + s.blocks_used == s.num_blocks


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_greedy_matches_transformers(kind, tiny_models, hf_reference):
    # a small token budget forces chunked prefill of the long prompts
    config = EngineConfig(kv_cache_bytes=64 << 20, max_num_batched_tokens=128)
    engine, ours = _run(tiny_models[kind], config, _prompts())
    hf, theirs = hf_reference[kind]
    for prompt, a, b in zip(_prompts(), ours, theirs, strict=True):
        _assert_same_or_near_tie(hf, prompt, a, b)
    _assert_no_leak(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_greedy_matches_under_preemption(mode, tiny_models, hf_reference):
    # 24 blocks of 16 tokens: the 14 prompts cannot all run at once
    engine = LLMEngine.from_pretrained(
        str(tiny_models["llama"]),
        EngineConfig(
            kv_cache_bytes=24 * 16 * 2 * 2 * 2 * 64 * 4,
            preemption_mode=mode,
            enable_prefix_caching=False,
        ),
        progress=lambda _m: None,
    )
    assert engine.bm.pool.num_blocks == 24
    prompts = _prompts()
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_NEW))
    s = engine.stats()
    assert (s.preemptions_swap if mode == "swap" else s.preemptions_recompute) > 0
    hf, theirs = hf_reference["llama"]
    for prompt, out, b in zip(prompts, outs, theirs, strict=True):
        _assert_same_or_near_tie(hf, prompt, out.outputs[0].token_ids, b)
    _assert_no_leak(engine)


def test_prefix_caching_reuses_shared_prefixes(tiny_models, hf_reference):
    rng = random.Random(7)
    shared = [rng.randrange(3, 49152) for _ in range(100)]
    prompts = [shared + [rng.randrange(3, 49152) for _ in range(n)] for n in (1, 5, 20, 40)]
    path = tiny_models["llama"]
    engine = LLMEngine.from_pretrained(
        str(path), EngineConfig(kv_cache_bytes=32 << 20), progress=lambda _m: None
    )
    first = engine.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=MAX_NEW))
    rest = engine.generate(prompts[1:], SamplingParams(temperature=0, max_tokens=MAX_NEW))
    assert engine.stats().prefix_hit_tokens >= 3 * 96  # 6 full blocks of the shared prefix each
    assert all(o.usage.cached_tokens >= 96 for o in rest)
    hf = hf_reference["llama"][0]
    for prompt, out in zip(prompts, first + rest, strict=True):
        _assert_same_or_near_tie(
            hf, prompt, out.outputs[0].token_ids, _hf_greedy(hf, prompt, MAX_NEW)
        )
    # a second turn reuses the first turn's prompt *and* reply blocks
    turn2 = prompts[0] + first[0].outputs[0].token_ids + [5, 6, 7]
    again = engine.generate([turn2], SamplingParams(temperature=0, max_tokens=4))[0]
    assert again.usage.cached_tokens == (len(prompts[0]) + MAX_NEW - 1) // 16 * 16
    _assert_no_leak(engine)


@pytest.mark.slow  # the real default model
def test_default_model_chats_match_transformers(default_model_dir):
    questions = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "List three prime numbers.",
    ]
    engine = LLMEngine.from_pretrained(None, EngineConfig(), progress=lambda _m: None)
    prompts = [
        render_prompt(
            engine.tokenizer,
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": q},
            ],
        )
        for q in questions
    ]
    outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    assert outs[0].outputs[0].text.startswith("The capital of France is Paris")
    hf = reference_model(default_model_dir)
    for prompt, out in zip(prompts, outs, strict=True):
        _assert_same_or_near_tie(hf, prompt, out.outputs[0].token_ids, _hf_greedy(hf, prompt, 16))
    _assert_no_leak(engine)


# -- bad input ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_engine(tiny_models):
    return LLMEngine.from_pretrained(
        str(tiny_models["llama"]),
        EngineConfig(kv_cache_bytes=40 * 16 * 2 * 2 * 2 * 64 * 4),
        progress=lambda _m: None,
    )


def test_prompt_over_context_window_is_refused(small_engine):
    with pytest.raises(ValueError, match=r"context window is 1024.*shorten it by at least 977"):
        small_engine.add_request([5] * 2000, SamplingParams(max_tokens=4))


def test_request_larger_than_kv_pool_is_refused(small_engine):
    with pytest.raises(ValueError, match=r"needs \d+ KV blocks .* raise the KV cache size"):
        small_engine.add_request([5] * 600, SamplingParams(max_tokens=100))


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -0.5),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("n", 0),
        ("max_tokens", 0),
        ("top_k", -1),
        ("beam_width", -2),
        ("stop", [""]),
    ],
)
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SamplingParams\.{field} must be"):
        SamplingParams(**{field: value})


def test_abort_unknown_or_finished_is_harmless_and_engine_keeps_serving(small_engine):
    assert small_engine.abort("no-such-request") is None
    rid = small_engine.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3))
    while small_engine.has_unfinished():
        small_engine.step()
    assert small_engine.abort(rid) is None
    # abort mid-way frees everything
    rid = small_engine.add_request(
        list(range(10, 60)), SamplingParams(temperature=0, max_tokens=50)
    )
    small_engine.step()
    small_engine.step()
    assert small_engine.stats().blocks_used > 0
    final = small_engine.abort(rid)
    assert final.finished and final.outputs[0].finish_reason == "abort"
    _assert_no_leak(small_engine)
    out = small_engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2))[0]
    assert out.finished and len(out.outputs[0].token_ids) == 2


def test_missing_and_unsupported_models_get_clear_errors(tmp_path):
    from chatpage.engine.load.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="model path not found"):
        LLMEngine.from_pretrained(str(tmp_path / "nope"))
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(
        '{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}'
    )
    with pytest.raises(ModelLoadError, match=r"unsupported architecture 'GPT2LMHeadModel'.*llama"):
        LLMEngine.from_pretrained(str(tmp_path / "gpt2"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="has no config.json"):
        LLMEngine.from_pretrained(str(tmp_path / "empty"))


def test_no_chat_template_falls_back_with_a_warning(tmp_path, tiny_models):
    import json
    import shutil

    d = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], d)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    engine = LLMEngine.from_pretrained(
        str(d), EngineConfig(kv_cache_bytes=8 << 20), progress=lambda _m: None
    )
    assert any("no chat template" in w for w in engine.warnings)
    ids = render_prompt(engine.tokenizer, [{"role": "user", "content": "hi"}])
    assert engine.tokenizer.decode(ids).startswith("User: hi")


def test_generate_ignores_other_requests_in_flight(small_engine):
    other = small_engine.add_request([9, 8, 7], SamplingParams(temperature=0, max_tokens=1))
    out = small_engine.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=6))
    assert [o.request_id for o in out] != [other] and len(out[0].outputs[0].token_ids) == 6
    assert not small_engine.has_unfinished()
