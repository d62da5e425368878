"""One request's sampling values never fail another's (issue 20, item 1).

Values at the edge of the float range are computed as their limits (a temperature too small to
divide by is greedy, the top token is always in the nucleus, beam scores are compared in log
space), and a row that still cannot be sampled fails its own request, with its message, while
the rest of the batch goes on. The real engine over a tiny random Llama.
"""

from __future__ import annotations

import pytest
import torch

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestOutput
from chatpage.engine.processor import RequestRefused
from chatpage.engine.sampling_params import MAX_LOGPROB_ENTRIES, GrammarKind, Structured
from chatpage.engine.text.grammar import GrammarMatcher
from chatpage.vocab import FinishReason

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return LLMEngine.from_pretrained(
        str(tiny_llama_dir), EngineConfig(kv_cache_bytes=64 * BLOCK_BYTES), progress=lambda _m: None
    )


BATCH = {
    "greedy": SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    "sampled": SamplingParams(temperature=0.9, seed=1, max_tokens=8, ignore_eos=True),
    "n": SamplingParams(n=2, temperature=0.9, seed=2, max_tokens=8, ignore_eos=True),
    "beam": SamplingParams(beam_width=2, max_tokens=6),
}
"""A batch of every kind of request, beside which one that fails must leave them as they were."""


def _run(engine: LLMEngine, params: dict[str, SamplingParams]) -> dict[str, RequestOutput]:
    """Every request of ``params`` (by name) in one batch, to the end."""
    ids = {engine.add_request(PROMPT, p): name for name, p in params.items()}
    outputs = OutputAccumulator()
    done: dict[str, RequestOutput] = {}
    for _ in range(200):
        if not engine.has_unfinished():
            break
        for update in engine.step():
            out = outputs.add(update)
            if out.finished:
                done[ids[out.request_id]] = out
    assert not engine.has_unfinished(), sorted(engine.groups)
    stats = engine.stats()
    assert stats.blocks_used == stats.blocks_pinned and stats.blocks_swapped == 0
    return done


def _tokens(out: RequestOutput) -> list[int]:
    return out.outputs[0].token_ids


def test_values_at_the_edge_of_the_float_range_run_as_their_limits(engine):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    done = _run(
        engine,
        {
            "greedy": greedy,
            "tiny temperature": SamplingParams(temperature=1e-40, max_tokens=8, ignore_eos=True),
            "tiny top_p": SamplingParams(top_p=1e-300, seed=3, max_tokens=8, ignore_eos=True),
            "tiny top_p, top_k": SamplingParams(
                top_p=1e-300, top_k=300, seed=3, max_tokens=8, ignore_eos=True
            ),
            "long beams win": SamplingParams(beam_width=2, length_penalty=1000.0, max_tokens=6),
            "short beams win": SamplingParams(beam_width=2, length_penalty=-1000.0, max_tokens=6),
            "sampled": SamplingParams(temperature=0.8, seed=1, max_tokens=8, ignore_eos=True),
        },
    )
    assert {name: out.error for name, out in done.items() if out.error} == {}
    assert _tokens(done["tiny temperature"]) == _tokens(done["greedy"])  # greedy, as vLLM
    assert _tokens(done["tiny top_p"]) == _tokens(done["greedy"])  # the top token only
    assert _tokens(done["tiny top_p, top_k"]) == _tokens(done["greedy"])
    for name in ("long beams win", "short beams win"):
        beams = done[name].outputs
        assert len(beams) == 2 and all(c.finish_reason is not None for c in beams), name
        assert all(c.score is not None and c.score == c.score for c in beams), name  # no NaN
    alone = _run(
        engine, {"sampled": SamplingParams(temperature=0.8, seed=1, max_tokens=8, ignore_eos=True)}
    )
    assert _tokens(alone["sampled"]) == _tokens(done["sampled"])


def test_a_row_that_cannot_be_sampled_fails_its_own_request_only(engine, monkeypatch):
    """A row whose sampling raises (here: its logits made NaN, for one seed, after the real
    constraints ran) ends its request with the real sampler's error; the batch's other
    requests, seeded ones included, come out exactly as they do without it."""
    real = engine.constraints.apply

    def nan_for_seed_13(logits, rows):
        failed = real(logits, rows)
        with torch.inference_mode():  # the step's logits are inference tensors
            for row, p, _matcher in rows:
                if p.seed == 13:
                    logits[row] = float("nan")
        return failed

    others = BATCH
    expected = _run(engine, others)
    monkeypatch.setattr(engine.constraints, "apply", nan_for_seed_13)
    # a logit bias puts the row through the constraints
    bad = {
        "bad": SamplingParams(temperature=0.9, seed=13, max_tokens=8, logit_bias={3: 1.0}),
        "bad n": SamplingParams(n=3, temperature=0.9, seed=13, max_tokens=8, logit_bias={3: 1.0}),
    }
    done = _run(engine, {**bad, **others})
    for name in bad:
        assert done[name].error == (
            f"{done[name].request_id} could not be sampled: "
            "RuntimeError: probability tensor contains either `inf`, `nan` "
            "or element < 0"
        ), name
        assert all(c.finish_reason is FinishReason.ERROR for c in done[name].outputs)
    for name in others:
        assert done[name].error is None, name
        got = [(c.token_ids, c.finish_reason) for c in done[name].outputs]
        assert got == [(c.token_ids, c.finish_reason) for c in expected[name].outputs], name


def test_a_request_whose_update_raises_fails_alone(engine, monkeypatch):
    """A request whose picks cannot be taken in (here: its stop check raises, for one seed)
    ends with that error, its blocks freed; the batch's other requests come out exactly as they
    do without it (the step itself does not fail)."""
    others = BATCH
    expected = _run(engine, others)
    real = engine.scheduler.stop

    def broken_for_seed_13(params, seq):
        if params.seed == 13 and seq.num_output_tokens == 2:
            raise RuntimeError("the stop check broke")
        return real(params, seq)

    monkeypatch.setattr(engine.scheduler, "stop", broken_for_seed_13)
    bad = {"bad": SamplingParams(n=2, temperature=0.9, seed=13, max_tokens=8)}
    done = _run(engine, {**bad, **others})
    assert done["bad"].error == (
        f"{done['bad'].request_id} could not be updated: RuntimeError: the stop check broke"
    )
    assert all(c.finish_reason is FinishReason.ERROR for c in done["bad"].outputs)
    for name in others:
        assert done[name].error is None, name
        got = [(c.token_ids, c.finish_reason) for c in done[name].outputs]
        assert got == [(c.token_ids, c.finish_reason) for c in expected[name].outputs], name


def test_a_row_whose_bias_or_mask_raises_fails_its_own_request_only(engine):
    """Per-request work in the step (a logit bias, a grammar mask) that raises for one row
    ends that row's request with the error; the batch's other requests, constrained ones
    included, come out exactly as they do without it (issue 40, item 1)."""
    digits = Structured(GrammarKind.REGEX, "[0-9]{4}")
    others = {
        "greedy": SamplingParams(temperature=0, max_tokens=6, ignore_eos=True),
        "sampled": SamplingParams(temperature=0.9, seed=1, max_tokens=6, ignore_eos=True),
        "biased": SamplingParams(temperature=0, max_tokens=6, logit_bias={42: 100}),
        "digits": SamplingParams(temperature=0, max_tokens=6, structured=digits),
        "beam": SamplingParams(beam_width=2, max_tokens=6),
    }
    expected = _run(engine, others)
    ids = {
        engine.add_request(PROMPT, p): name
        for name, p in {
            **others,
            "bad bias": SamplingParams(temperature=0, max_tokens=6, logit_bias={7: 1.0}),
            "bad mask": SamplingParams(n=2, seed=4, max_tokens=6, structured=digits),
        }.items()
    }
    by_name = {name: rid for rid, name in ids.items()}
    # what add_request refuses, put in behind its back: an id past the vocabulary (and past
    # int64), a matcher llguidance cannot compute a mask for
    engine.groups[by_name["bad bias"]].params.logit_bias[2**64] = 1.0
    engine.groups[by_name["bad mask"]].seqs[0].matcher = GrammarMatcher(object())
    outputs = OutputAccumulator()
    done: dict[str, RequestOutput] = {}
    for _ in range(100):
        for update in engine.step():
            out = outputs.add(update)
            if out.finished:
                done[ids[out.request_id]] = out
        if not engine.has_unfinished():
            break
    assert len(done) == len(ids)
    for name in ("bad bias", "bad mask"):
        assert done[name].error is not None and "could not be sampled" in done[name].error
        assert all(c.finish_reason is FinishReason.ERROR for c in done[name].outputs)
    assert "Overflow" in done["bad bias"].error
    for name in others:
        assert done[name].error is None, name
        got = [(c.token_ids, c.finish_reason) for c in done[name].outputs]
        assert got == [(c.token_ids, c.finish_reason) for c in expected[name].outputs], name
    stats = engine.stats()
    assert stats.blocks_used == stats.blocks_pinned and stats.blocks_swapped == 0


@pytest.mark.parametrize("token", [49152, 2**63, 2**200])
def test_a_logit_bias_past_the_vocabulary_is_refused_at_add_request(engine, token):
    with pytest.raises(RequestRefused, match=f"logit_bias names token {token}, which is not in"):
        engine.add_request(PROMPT, SamplingParams(max_tokens=2, logit_bias={token: 1.0}))
    assert not engine.has_unfinished()


def test_n_by_max_tokens_by_top_logprobs_is_capped(engine):
    """n x max_tokens (as far as the context reaches) x (top_logprobs + 1) is bounded per
    request (issue 40, item 10): one sample fewer passes that check (and meets the next, this
    small KV cache's)."""
    room = engine.max_model_len - len(PROMPT)
    n = MAX_LOGPROB_ENTRIES // (room * 21) + 1
    big = SamplingParams(n=n, max_tokens=10**9, logprobs=20)
    with pytest.raises(RequestRefused, match=f"up to {n * room * 21} log-probabilities"):
        engine.add_request(PROMPT, big)
    fits = SamplingParams(n=n - 1, max_tokens=10**9, logprobs=20)
    with pytest.raises(RequestRefused, match="KV blocks"):
        engine.add_request(PROMPT, fits)
