"""Per-token logprobs and the top-N alternatives (``SamplingParams.logprobs``), against
transformers' log_softmax on a tiny random Llama."""

from __future__ import annotations

import random

import pytest
import torch

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.outputs import CompletionOutput

PROMPT = [random.Random(5).randrange(3, 49152) for _ in range(29)]


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return LLMEngine.from_pretrained(
        str(tiny_llama_dir), EngineConfig(kv_cache_bytes=32 << 20), progress=lambda _m: None
    )


@torch.inference_mode()
def _reference(hf, c: CompletionOutput) -> torch.Tensor:
    """log_softmax of transformers' logits at each step that generated one of ``c``'s tokens."""
    logits = hf(torch.tensor([PROMPT + c.token_ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[len(PROMPT) - 1 : len(PROMPT) - 1 + len(c.token_ids)]


def _assert_top_matches(c: CompletionOutput, ref: torch.Tensor, count: int) -> None:
    assert c.top_logprobs is not None and len(c.top_logprobs) == len(c.token_ids)
    for step, (top, tok, lp) in enumerate(
        zip(c.top_logprobs, c.token_ids, c.logprobs, strict=True)
    ):
        values, ids = torch.topk(ref[step], count)
        assert list(top) == ids.tolist(), f"step {step}: not transformers' top {count}"
        assert list(top.values()) == pytest.approx(values.tolist(), abs=1e-4)
        assert lp == pytest.approx(float(ref[step, tok]), abs=1e-4)
        if tok in top:  # the same number either way
            assert top[tok] == pytest.approx(lp, abs=1e-5)


def test_greedy_top_logprobs_equal_transformers(tiny, tiny_hf):
    out = tiny.generate([PROMPT], SamplingParams(temperature=0, max_tokens=8, logprobs=5))[0]
    c = out.outputs[0]
    _assert_top_matches(c, _reference(tiny_hf, c), 5)
    # greedy: the sampled token is the best of each list, with the same logprob
    for top, tok, lp in zip(c.top_logprobs, c.token_ids, c.logprobs, strict=True):
        best, best_lp = next(iter(top.items()))
        assert best == tok and best_lp == pytest.approx(lp, abs=1e-6)
    assert sum(c.logprobs) == pytest.approx(c.cumulative_logprob, abs=1e-4)


def test_sampled_forks_carry_their_own_top_logprobs(tiny, tiny_hf):
    """n samples: each fork's lists follow its own tokens (raw logits, not temperature-scaled);
    a request that did not ask, in the same batch, gets no alternatives."""
    asking, plain = tiny.generate(
        [PROMPT, PROMPT[:-3]],
        [
            SamplingParams(n=3, temperature=1.3, top_k=50, seed=4, max_tokens=10, logprobs=3),
            SamplingParams(temperature=1.0, seed=1, max_tokens=10),
        ],
    )
    assert len({tuple(c.token_ids) for c in asking.outputs}) > 1
    for c in asking.outputs:
        _assert_top_matches(c, _reference(tiny_hf, c), 3)
    assert plain.outputs[0].logprobs is None and plain.outputs[0].top_logprobs is None


@pytest.mark.parametrize("flag", [0, True])
def test_logprobs_zero_is_the_sampled_token_only(tiny, flag):
    c = tiny.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, logprobs=flag))[
        0
    ].outputs[0]
    assert len(c.logprobs) == 4 and all(lp <= 0 for lp in c.logprobs)
    assert c.top_logprobs is None


def test_beam_search_returns_per_beam_logprobs(tiny, tiny_hf):
    """Like vLLM: each final beam has its tokens' logprobs (summing to its cumulative logprob)
    and, per step, the top tokens after that beam's own prefix."""
    out = tiny.generate([PROMPT], SamplingParams(beam_width=3, max_tokens=6, logprobs=2))[0]
    assert len(out.outputs) == 3
    for c in out.outputs:
        assert sum(c.logprobs) == pytest.approx(c.cumulative_logprob, abs=1e-4)
        _assert_top_matches(c, _reference(tiny_hf, c), 2)


@pytest.mark.parametrize("bad", [21, -1, 2.5, "3"])
def test_logprobs_out_of_range_is_refused_naming_the_field(bad):
    with pytest.raises(
        ValueError,
        match=r"SamplingParams\.logprobs must be a whole number >= 0 "
        r"and <= 20",
    ):
        SamplingParams(logprobs=bad)


def test_logprobs_flags_normalise():
    assert SamplingParams(logprobs=True).logprobs == 0
    assert SamplingParams(logprobs=False).logprobs is None
    assert SamplingParams(logprobs=20).top_logprobs == 20
    assert SamplingParams().top_logprobs == 0
