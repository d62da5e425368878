"""Draftless speculative decoding (engine/core/speculate.py): drafts found by n-gram lookup,
verified in the batched step, and greedy output identical with and without it."""

from __future__ import annotations

import dataclasses
import json
import random

import jsonschema
import pytest
import torch
from grammar_specs import JSON, SCHEMA

from chatpage.bench import common
from chatpage.engine import SamplingParams
from chatpage.engine.config import PreemptionMode
from chatpage.engine.core.speculate import (
    ALIGNED_RATE,
    MAX_DRAFT,
    NgramIndex,
    SpecState,
    Speculator,
    draft_length,
    grammar_draft,
    row_cost,
    step_cost,
)
from chatpage.engine.load.loader import load_model

WEIGHTS = "int4"  # (the default format: its kernels compute every row alike, fp32's GEMV not)


@pytest.fixture(scope="module")
def loaded(tiny_llama_dir):
    return load_model(tiny_llama_dir, progress=lambda _m: None)


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    """Prompts that repeat themselves (a phrase said twice, a list of items with a pattern),
    and some that do not."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        phrase = [rng.randrange(3, 400) for _ in range(rng.randrange(3, 12))]
        noise = [rng.randrange(3, 400) for _ in range(rng.randrange(1, 40))]
        prompts.append(noise + phrase * (1 + i % 4) + phrase[: i % len(phrase)])
    return prompts


def _greedy(engine, prompts, max_tokens=40, speculate=True):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, speculate=speculate, logprobs=2)
    outs = [engine.generate([p], params)[0].outputs[0] for p in prompts]
    return [(o.token_ids, o.logprobs, o.top_logprobs, o.finish_reason) for o in outs]


def test_the_index_drafts_what_followed_the_longest_suffix_found():
    tokens = [1, 2, 3, 4, 9, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4]
    state = SpecState(NgramIndex(tokens))
    # "2 3 4" last occurred before "5 6 7 8" (the 4-gram "8 2 3 4" never did)
    assert state.draft(tokens, 3, 0) == ([5, 6, 7], 0.0)
    tokens.append(5)  # the list grows in place; the index follows it
    assert state.draft(tokens, 2, 0) == ([6, 7], 0.0)
    assert state.draft([42, 43], 4, 0) == ([], 0.0)  # never seen
    # a draft source (the reply a regenerate replaces) comes before the sequence itself, for
    # a suffix as long
    source = SpecState(NgramIndex(tokens), [NgramIndex([2, 3, 4, 5, 70, 71])])
    assert source.draft(tokens, 2, 0) == ([70, 71], 0.0)
    # and one the output so far starts goes on from there (a regenerate's first tokens)
    assert source.draft([*tokens, 2, 3], 2, 2) == ([4, 5], ALIGNED_RATE)


def test_the_longest_match_wins_over_the_latest_occurrence():
    """A file copied back: "3 4 5 6" occurred twice, and what came before the second one differs
    from the context's, so the draft follows the first (a suffix match, not the latest n-gram)."""
    tokens = [1, 2, 3, 4, 5, 6, 9, 8, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6]
    assert NgramIndex(tokens).longest(tokens, 4) == (6, 5)
    assert SpecState(NgramIndex(tokens)).draft(tokens, 2, 0) == ([9, 8], 0.0)
    # equals: the latest
    assert NgramIndex([5, 6, 1, 5, 6, 2, 5, 6]).longest([5, 6], 2) == (2, 4)


def test_the_draft_length_follows_the_acceptance_and_the_cost():
    state = SpecState(NgramIndex([]))
    alone, far = (1, step_cost([300]), row_cost(300)), (1, step_cost([3000]), row_cost(3000))
    start = draft_length(state.rate, *alone)
    for _ in range(10):
        state.verified(8, 8)
    assert draft_length(state.rate, *alone) == MAX_DRAFT > start
    # nearly every draft kept: still shorter where a drafted row's attention costs more
    assert 0 < draft_length(0.97, *far) < draft_length(0.97, *alone) < MAX_DRAFT
    for _ in range(30):
        state.verified(4, 0)
    assert draft_length(state.rate, *alone) == 0  # no longer pays: the sequence stops drafting


def test_the_cost_model_drops_drafts_that_cost_more_than_they_bring(loaded):
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    group_seq = []
    for prompt in ([5, 6, 7, 5, 6, 7, 5, 6], [8, 9, 8, 9, 8, 9, 8, 9]):
        rid = engine.add_request(prompt, SamplingParams(temperature=0, max_tokens=30))
        group = engine.groups[rid]
        group_seq.append((group, group.seqs[0]))
    spec = Speculator(engine.model.exact_rows)
    assert all(spec.plan(group_seq, 64))  # both repeat themselves: both draft
    for group, seq in group_seq:
        spec.state(group, seq).rates = [0.02, 0.02]  # nearly never accepted
    assert spec.plan(group_seq, 64) == [[], []]


@pytest.mark.parametrize("count", [4, pytest.param(24, marks=pytest.mark.slow)])
def test_greedy_output_is_identical_with_and_without_speculation(loaded, count):
    """Many prompts, alone each (the case speculation is for): the same tokens, log-probabilities
    and alternatives, bit for bit, while most steps draft and many drafts are kept (4 prompts in
    the quick loop, 24 with the slow tests)."""
    prompts = _prompts(count)
    off = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    on = common.engine(loaded, weight_dtype=WEIGHTS)
    assert on.model.exact_rows > 1 and on.speculator.enabled and not off.speculator.enabled
    assert _greedy(off, prompts) == _greedy(on, prompts)
    assert on.speculator.accepted > 0.3 * on.speculator.drafted > 0
    assert not on.bm.audit()


def _steps(engine, prompts, params) -> tuple[int, list[list[int]]]:
    """Steps taken and outputs of ``prompts`` run at once (``params`` each)."""
    rids = [engine.add_request(p, q) for p, q in zip(prompts, params, strict=True)]
    got: dict[str, list[int]] = {rid: [] for rid in rids}
    steps = 0
    while engine.has_unfinished():
        steps += 1
        for update in engine.step():
            got[update.request_id] += (t for out in update.outputs for t in out.token_ids)
    return steps, [got[rid] for rid in rids]


def test_a_batch_keeps_every_drafted_rows_picks(loaded):
    """A regenerate drafting beside requests that do not, in one step: its kept tokens are
    appended (every accepted draft is an output token), so the batch takes fewer steps than
    without speculation, and the outputs are the same."""
    prompts = _prompts(3, seed=7)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    off = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    plain_steps, plain = _steps(off, prompts, [params] * 3)
    on = common.engine(loaded, weight_dtype=WEIGHTS)
    again = dataclasses.replace(params, draft_source=[plain[0]])
    steps, got = _steps(on, prompts, [again, params, params])
    assert got == plain
    assert 0 < on.speculator.accepted <= sum(map(len, got)) - len(prompts)
    assert steps < plain_steps


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 5, MAX_DRAFT])
def test_every_draft_length_is_exact(loaded, k):
    prompts = _prompts(6, seed=k)
    off = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    on = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=k)
    assert _greedy(off, prompts) == _greedy(on, prompts)
    assert on.speculator.drafted > 0


@pytest.mark.slow
def test_concurrent_requests_under_preemption_stay_exact(loaded):
    """A pool too small for the batch: groups are preempted (recompute and swap) while others
    draft. With steps of at most 16 rows every row is computed alike whatever the batch (the
    kernels' row invariance), so every output is the one it has alone without speculation."""
    prompts = _prompts(6, seed=7)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    small = {"weight_dtype": WEIGHTS, "max_num_batched_tokens": 16}
    off = common.engine(loaded, num_speculative_tokens=0, **small)
    alone = [off.generate([p], params)[0].outputs[0].token_ids for p in prompts]
    for mode in ("recompute", "swap"):
        on = common.engine(loaded, blocks=10, preemption_mode=mode, **small)
        together = on.generate(prompts, params)
        assert [o.outputs[0].token_ids for o in together] == alone
        assert on.scheduler.preemptions[PreemptionMode(mode)] > 0 and on.speculator.accepted > 0
        assert not on.bm.audit()


def test_rejected_drafts_never_reach_the_prefix_cache(loaded):
    """Every indexed block holds tokens the sequence really has: a second request over the
    first one's whole text hits the cache for all of its full blocks, and decodes the same."""
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    prompt = _prompts(1, seed=3)[0]
    first = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=50))[0]
    assert engine.speculator.drafted > engine.speculator.accepted > 0  # some were rejected
    text = prompt + first.outputs[0].token_ids
    hits = engine.bm.prefix_hit_tokens
    engine.generate([text], SamplingParams(temperature=0, max_tokens=1))
    assert engine.bm.prefix_hit_tokens - hits == (len(text) - 1) // 16 * 16
    assert not engine.bm.audit()


def test_a_draft_source_is_drafted_from(loaded):
    """A regenerate drafts from the reply it replaces: the old reply's tokens are accepted
    from the first step on."""
    prompt = [rng for rng in range(40, 60)]
    plain = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    reply = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=30))[0]
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    params = SamplingParams(temperature=0, max_tokens=30, draft_source=[reply.outputs[0].token_ids])
    again = engine.generate([prompt], params)[0]
    assert again.outputs[0].token_ids == reply.outputs[0].token_ids
    assert engine.speculator.accepted >= 25  # (of 28: the last token is never drafted)
    # the request's usage counts them (the reply's stats line shows them)
    usage = again.usage
    assert (usage.accepted_tokens, usage.draft_tokens) == (
        engine.speculator.accepted,
        engine.speculator.drafted,
    )


def test_a_seeded_sampled_request_speculates_and_repeats_itself(loaded):
    """Sampled requests are verified by speculative sampling (its statistics:
    test_speculative_sampling.py); the same seed gives the same reply (on engines alike: a
    prompt served from the prefix cache has its last block computed in a smaller step)."""
    prompt = _prompts(4)[3]
    params = SamplingParams(temperature=0.3, seed=1, max_tokens=40)
    engines = [common.engine(loaded, weight_dtype=WEIGHTS) for _ in range(2)]
    first, again = (e.generate([prompt], params)[0].outputs[0].token_ids for e in engines)
    assert first == again and engines[0].speculator.accepted > 0


def test_beam_requests_and_requests_that_turn_it_off_are_not_speculated(loaded):
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    prompt = _prompts(1)[0]
    for params in (
        SamplingParams(beam_width=2, max_tokens=10),
        SamplingParams(temperature=0, max_tokens=20, speculate=False),
    ):
        engine.generate([prompt], params)
    assert engine.speculator.drafted == 0


def test_a_sample_drafts_from_its_siblings_outputs():
    """The n samples of a request draft from each other: what followed a context in a sibling's
    output is drafted where the sequence's own tokens never had it."""
    prompt = [1, 2, 3]
    own = prompt + [7, 8, 9]
    sibling = prompt + [7, 8, 9, 4, 5, 6]
    state = SpecState(NgramIndex(own), peers=[NgramIndex(sibling, start=len(prompt))])
    assert state.draft(own, 3, 3) == ([4, 5, 6], 0.0)
    assert (1, 2) not in state.peers[0].ends  # (the prompt is in the sequence's own index)
    assert SpecState(NgramIndex(own)).draft(own, 3, 3) == ([], 0.0)


def test_n_samples_speculate_and_stay_exact(loaded):
    """A request of n samples drafts once it has forked them (here from the reply it
    regenerates): greedy samples are the ones without speculation, and a seeded sampled
    request repeats itself."""
    prompt = _prompts(4)[3]
    off = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    reply = off.generate([prompt], SamplingParams(temperature=0, max_tokens=40))[0]
    greedy = SamplingParams(
        temperature=0, n=2, max_tokens=40, draft_source=[reply.outputs[0].token_ids]
    )
    on = common.engine(loaded, weight_dtype=WEIGHTS)
    want, got = ([o.token_ids for o in e.generate([prompt], greedy)[0].outputs] for e in (off, on))
    assert got == want == [reply.outputs[0].token_ids] * 2
    assert on.speculator.accepted > 0
    sampled = dataclasses.replace(greedy, temperature=0.3, seed=1)
    engines = [common.engine(loaded, weight_dtype=WEIGHTS) for _ in range(2)]
    first, again = (
        [o.token_ids for o in e.generate([prompt], sampled)[0].outputs] for e in engines
    )
    assert first == again and engines[0].speculator.accepted > 0
    assert not on.bm.audit() and not engines[0].bm.audit()


def test_a_grammar_drafts_the_tokens_it_forces_and_cuts_what_it_does_not_allow(loaded):
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    matcher = engine.grammars.matcher(JSON)
    forced = matcher.forced()
    assert forced  # (the object's opening and its first key)
    assert grammar_draft(matcher, lambda: ([5, 6], 0.0), 4) == (forced[:4], 1.0)
    text = engine.tokenizer.encode(
        '{"color": "red", "count": 42, "ok": true}', add_special_tokens=False
    )
    assert matcher.valid_prefix(text) == len(text)  # (the text follows the schema)
    at = 0
    while matcher.forced():  # on to where the grammar leaves a choice
        matcher.advance(text[at])
        at += 1
    said = text[at : at + 2]
    ahead = matcher.fork()
    for token in said:
        ahead.advance(token)
    junk = next(t for t in range(engine.model.vocab_size) if ahead.valid_prefix([t]) == 0)
    assert grammar_draft(matcher, lambda: ([*said, junk, *said], 0.5), 5) == (said, 0.5)


def test_a_grammar_constrained_request_speculates_and_stays_exact(loaded):
    """Under a JSON schema the forced tokens (keys, punctuation) are drafted and kept, and each
    drafted row is masked where the grammar stands after the drafts before it: the greedy
    output is the one without speculation, a seeded sampled one repeats itself, and both
    follow the schema."""
    prompt = _prompts(1)[0]
    params = SamplingParams(temperature=0, max_tokens=80, structured=JSON)
    off = common.engine(loaded, weight_dtype=WEIGHTS, num_speculative_tokens=0)
    on = common.engine(loaded, weight_dtype=WEIGHTS)
    want, got = (e.generate([prompt], params)[0].outputs[0] for e in (off, on))
    assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
    jsonschema.validate(json.loads(got.text), SCHEMA)
    assert on.speculator.accepted > 0
    # sampled: its drafted rows masked before speculative sampling; the same seed, the same JSON
    sampled = dataclasses.replace(params, temperature=0.8, seed=2)
    engines = [common.engine(loaded, weight_dtype=WEIGHTS) for _ in range(2)]
    first, again = (e.generate([prompt], sampled)[0].outputs[0] for e in engines)
    assert first.token_ids == again.token_ids and engines[0].speculator.accepted > 0
    jsonschema.validate(json.loads(first.text), SCHEMA)
    assert not on.bm.audit() and not engines[0].bm.audit()


def test_without_row_invariant_kernels_nothing_is_drafted(loaded, monkeypatch):
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    engine.model.native_layers = None  # (the Python loop: its kernels promise no invariance)
    assert engine.model.exact_rows == 1
    assert not Speculator(engine.model.exact_rows).enabled


@torch.inference_mode()
def test_each_matmul_computes_a_row_alike_in_every_step_up_to_the_exact_rows(loaded):
    engine = common.engine(loaded, weight_dtype=WEIGHTS)
    model = engine.model
    torch.manual_seed(0)
    for f in (model.layers[0].qkv, model.layers[0].down, model.lm_head):
        x = torch.randn(model.exact_rows, f.in_features).to(model.mm_dtype)
        alone = torch.cat([f(x[i : i + 1]) for i in range(x.shape[0])])
        for rows in range(2, model.exact_rows + 1):
            assert torch.equal(f(x[:rows]), alone[:rows])
