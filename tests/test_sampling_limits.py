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
from chatpage.vocab import FinishReason

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
PROMPT = [5, 6, 7, 8, 9]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> LLMEngine:
    return LLMEngine.from_pretrained(
        str(tiny_llama_dir), EngineConfig(kv_cache_bytes=64 * BLOCK_BYTES), progress=lambda _m: None
    )


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
        real(logits, rows)
        with torch.inference_mode():  # the step's logits are inference tensors
            for row, p, _matcher in rows:
                if p.seed == 13:
                    logits[row] = float("nan")

    others = {
        "greedy": SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
        "sampled": SamplingParams(temperature=0.9, seed=1, max_tokens=8, ignore_eos=True),
        "n": SamplingParams(n=2, temperature=0.9, seed=2, max_tokens=8, ignore_eos=True),
        "beam": SamplingParams(beam_width=2, max_tokens=6),
    }
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
