"""The engine's output seam: one RequestUpdate per request per step, deltas end to end.

The deltas of a streamed request, appended (or, a beam's rewrite, replacing), give exactly the
outputs of the same request run with `generate`; a plain reply's text is the tokenizer's decoding
of its tokens, stop strings cut and never shown in part; a cancel or a failure ends with one
explicit final update.
"""

from __future__ import annotations

import pytest

from chatpage.engine import (
    EngineConfig,
    FinishReason,
    LLMEngine,
    OutputDelta,
    RequestUpdate,
    SamplingParams,
)
from chatpage.engine.core.sequence import Sequence
from chatpage.engine.core.stop import StopCheck
from chatpage.engine.text.detokenizer import IncrementalDetokenizer

PROMPT = list(range(100, 124))


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir) -> LLMEngine:
    return LLMEngine.from_pretrained(
        str(tiny_llama_dir), EngineConfig(kv_cache_bytes=16 << 20), progress=lambda _m: None
    )


def _stream(
    engine: LLMEngine, params: SamplingParams, prompt: list[int] = PROMPT
) -> list[RequestUpdate]:
    """Every update of one request, checking there is one per step and the last is final."""
    rid = engine.add_request(prompt, params)
    updates: list[RequestUpdate] = []
    while engine.has_unfinished():
        mine = [u for u in engine.step() if u.request_id == rid]
        assert len(mine) <= 1
        updates += mine
    assert [u.finished for u in updates] == [False] * (len(updates) - 1) + [True]
    return updates


def _joined(updates: list[RequestUpdate]) -> dict[int, dict]:
    """The outputs as a reader builds them: append each delta, or replace on a rewrite."""
    outs: dict[int, dict] = {}
    for update in updates:
        for d in update.outputs:
            o = outs.setdefault(d.index, {"text": "", "ids": [], "lps": [], "reason": None})
            if d.rewrite:
                o.update(text="", ids=[], lps=[])
            o["text"] += d.text
            o["ids"] += d.token_ids
            o["lps"] += d.logprobs or ()
            o["reason"] = d.finish_reason or o["reason"]
    if any(d.rewrite for d in updates[-1].outputs):  # the final beams are all there is
        named = {d.index for d in updates[-1].outputs}
        outs = {i: o for i, o in outs.items() if i in named}
    return outs


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=16),
        SamplingParams(temperature=0, max_tokens=12, logprobs=2),
        SamplingParams(n=3, temperature=1.0, seed=4, max_tokens=12, logprobs=0),
        SamplingParams(beam_width=3, max_tokens=8, logprobs=1),
    ],
    ids=["plain", "logprobs", "n", "beam"],
)
def test_streamed_deltas_join_into_the_generated_outputs(tiny, params):
    joined = _joined(_stream(tiny, params))
    (whole,) = tiny.generate([PROMPT], params)
    assert sorted(joined) == [c.index for c in whole.outputs]
    for c in whole.outputs:
        o = joined[c.index]
        assert (o["text"], o["ids"], o["reason"]) == (c.text, c.token_ids, c.finish_reason)
        if params.logprobs is not None:
            assert o["lps"] == c.logprobs and len(o["lps"]) == len(o["ids"])
        if not params.use_beam_search:
            assert c.text == tiny.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    assert whole.usage.completion_tokens == sum(len(c.token_ids) for c in whole.outputs)


def test_plain_and_sampled_deltas_only_append(tiny):
    for params in (
        SamplingParams(temperature=0, max_tokens=10),
        SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=10),
    ):
        updates = _stream(tiny, params)
        assert not any(d.rewrite for u in updates for d in u.outputs)
        # each token is sent once: the new ones of the step
        assert (
            sum(d.num_tokens for u in updates for d in u.outputs)
            == updates[-1].usage.completion_tokens
        )


def test_beams_stream_as_rewrites_and_end_with_the_hypotheses(tiny):
    updates = _stream(tiny, SamplingParams(beam_width=2, max_tokens=6))
    assert all(d.rewrite for u in updates for d in u.outputs)
    assert all(d.finish_reason is None for u in updates[:-1] for d in u.outputs)
    final = updates[-1].outputs
    assert [d.index for d in final] == list(range(len(final)))
    assert all(d.finish_reason is not None and d.score is not None for d in final)
    scores = [d.score for d in final]
    assert scores == sorted(scores, reverse=True)


def test_a_stop_string_is_cut_and_never_shown_in_part(tiny):
    plain = tiny.generate([PROMPT], SamplingParams(temperature=0, max_tokens=16))[0].outputs[0]
    text = plain.text
    assert len(text) > 12, text
    stop = text[6:10]  # spans tokens: the holdback must keep its start back
    params = SamplingParams(temperature=0, max_tokens=16, stop=[stop])
    updates = _stream(tiny, params)
    joined = _joined(updates)[0]
    cut = text[: text.index(stop)]
    assert joined["text"] == cut and joined["reason"] is FinishReason.STOP
    shown = ""
    for u in updates:  # at no step does any part of the stop string show
        shown += "".join(d.text for d in u.outputs)
        assert stop[0] not in shown[len(cut) :] and shown == cut[: len(shown)]
    assert tiny.generate([PROMPT], params)[0].outputs[0].text == cut


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=40),
        SamplingParams(n=2, temperature=1.0, seed=2, max_tokens=40),
        SamplingParams(beam_width=2, max_tokens=40),
    ],
    ids=["plain", "n", "beam"],
)
def test_a_cancel_ends_with_one_explicit_final_update(tiny, params):
    rid = tiny.add_request(PROMPT, params)
    seen: list[RequestUpdate] = []
    while not seen or seen[-1].usage.completion_tokens < 3 * params.width:
        seen += [u for u in tiny.step() if u.request_id == rid]
    final = tiny.abort(rid)
    assert final is not None and final.finished and final.error is None
    assert [d.index for d in final.outputs] == list(range(params.width))
    assert all(
        d.finish_reason is FinishReason.ABORT and d.text == "" and not d.token_ids
        for d in final.outputs
    )
    assert final.usage.prompt_tokens == len(PROMPT)
    assert tiny.abort(rid) is None  # once
    while tiny.has_unfinished():
        assert all(u.request_id != rid for u in tiny.step())
    assert tiny.stats().blocks_used == 0


def test_a_request_squeezed_out_by_a_pin_ends_with_one_error_update(tiny_llama_dir):
    block_bytes = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
    engine = LLMEngine.from_pretrained(
        str(tiny_llama_dir), EngineConfig(kv_cache_bytes=12 * block_bytes), progress=lambda _m: None
    )
    rid = engine.add_request(list(range(100, 116)), SamplingParams(temperature=0, max_tokens=150))
    updates = [u for u in engine.step() if u.request_id == rid]
    engine.pin_prefix(list(range(200, 248)))  # 3 blocks pinned from now on: 9 left, 11 needed
    while engine.has_unfinished():
        updates += [u for u in engine.step() if u.request_id == rid]
    assert [u.finished for u in updates] == [False] * (len(updates) - 1) + [True]
    final = updates[-1]
    assert final.outputs == (OutputDelta(0, finish_reason=FinishReason.ERROR),)
    assert "does not fit in the KV cache next to the pinned prefixes" in final.error
    assert final.usage.completion_tokens == sum(d.num_tokens for u in updates for d in u.outputs)


def test_a_long_prompt_reports_its_prefill_chunk_by_chunk(tiny_llama_dir):
    engine = LLMEngine.from_pretrained(
        str(tiny_llama_dir),
        EngineConfig(kv_cache_bytes=16 << 20, max_num_batched_tokens=32),
        progress=lambda _m: None,
    )
    prompt = list(range(100, 200))  # 100 tokens: 4 chunks of at most 32
    updates = _stream(engine, SamplingParams(temperature=0, max_tokens=2), prompt)
    before_first = [u for u in updates if not u.outputs]
    assert [u.usage.prefilled_tokens for u in before_first] == [32, 64, 96]
    assert all(u.usage.prompt_tokens == 100 and u.ttft_s is None for u in before_first)
    assert updates[len(before_first)].usage.prefilled_tokens == 100


def test_an_output_cut_off_inside_a_character_ends_with_what_decoding_it_gives(tiny):
    """An incomplete multi-byte character is held back while more tokens may complete it; an
    output that ends there (max_tokens) ends with its U+FFFD, as decoding the whole output gives,
    not without it."""
    tok = tiny.tokenizer
    ids = tok.encode("a\U0001f600", add_special_tokens=False)
    cut = next(i for i in range(1, len(ids)) if tok.decode(ids[:i]).endswith("\ufffd"))
    prompt = tok.encode("hi", add_special_tokens=False)

    def checked(max_tokens: int) -> tuple[FinishReason | None, str]:
        seq = Sequence(prompt + ids[:cut], len(prompt), IncrementalDetokenizer(tok, prompt, []))
        reason = StopCheck(frozenset(), 10_000)(SamplingParams(max_tokens=max_tokens), seq)
        return reason, seq.detok.text

    assert checked(cut + 1) == (None, "")  # held back (with the "a" decoded in the same call)
    whole = tok.decode(ids[:cut], skip_special_tokens=True)
    assert whole.endswith("\ufffd") and checked(cut) == (FinishReason.LENGTH, whole)
