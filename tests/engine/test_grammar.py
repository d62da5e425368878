"""Constrained decoding in the engine: grammars compiled once and cached, masks in the sampler,
matchers forked with n samples and beams, logit bias, and thinking split from the answer."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
import torch
from grammar_specs import JSON, SCHEMA

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.sample.constraints import forbid, unpack
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.chat_template import render_prompt
from chatpage.engine.text.grammar import grammar_text
from chatpage.engine.text.reasoning import ReasoningFormat, reasoning_format
from chatpage.vocab import FinishReason


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLMEngine.from_pretrained(str(tiny_llama_dir), EngineConfig(kv_cache_bytes=64 << 20))


def _prompt(engine) -> list[int]:
    return render_prompt(engine.tokenizer, [{"role": "user", "content": "A color, please."}])


def _valid(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=60, structured=JSON),
        SamplingParams(beam_width=2, temperature=0, max_tokens=60, structured=JSON),
        SamplingParams(temperature=0, max_tokens=60, structured=JSON),
    ],
    ids=["n3", "beam2", "greedy"],
)
def test_every_output_follows_the_schema(engine, params):
    (out,) = engine.generate([_prompt(engine)], params)
    assert len(out.outputs) == params.width
    for o in out.outputs:
        assert o.finish_reason is FinishReason.STOP, o.text
        _valid(o.text)
    if params.n == 3:  # the samples forked their matchers: each went its own way
        assert len({o.text for o in out.outputs}) > 1


def test_a_grammar_is_compiled_once_and_each_sequence_has_its_own_matcher(engine):
    before = engine.grammars.compiles
    spec = Structured(GrammarKind.REGEX, "(yes|no) [0-9]{2}")
    engine.generate(
        [_prompt(engine)] * 2, SamplingParams(temperature=0, max_tokens=20, structured=spec)
    )
    engine.generate(
        [_prompt(engine)], SamplingParams(temperature=1, seed=1, max_tokens=20, structured=spec)
    )
    assert engine.grammars.compiles == before + 1


def test_a_fork_moves_on_independently_of_its_parent(engine):
    spec = Structured(GrammarKind.CHOICE, json.dumps(["alpha", "beta"]))
    parent = engine.grammars.matcher(spec)
    child = parent.fork()
    ids = engine.tokenizer.encode("alpha", add_special_tokens=False)
    for t in ids:
        parent.advance(t)
    assert parent.done and parent.error is None
    assert not child.done  # still at the start: "beta" is open to it
    for t in engine.tokenizer.encode("beta", add_special_tokens=False):
        child.advance(t)
    assert child.done and child.error is None


def test_an_unfinished_structure_ends_at_max_tokens_as_length(engine):
    spec = Structured(GrammarKind.REGEX, "a[a-z]{40}")
    (out,) = engine.generate(
        [_prompt(engine)], SamplingParams(temperature=0, max_tokens=5, structured=spec)
    )
    assert out.outputs[0].finish_reason is FinishReason.LENGTH
    assert out.outputs[0].text.startswith("a")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (Structured(GrammarKind.JSON_SCHEMA, '{"type": "strin"}'), "strin"),
        (Structured(GrammarKind.REGEX, "a(b"), "unclosed group"),
        (Structured(GrammarKind.CHOICE, "[]"), "non-empty list"),
        (Structured(GrammarKind.GRAMMAR, "start: foo"), "foo"),
    ],
)
def test_bad_grammars_are_refused_naming_the_problem(engine, spec, words):
    with pytest.raises(ValueError, match=words):
        grammar_text(spec)
    with pytest.raises(ValueError, match=words):
        engine.add_request(_prompt(engine), SamplingParams(structured=spec))
    assert not engine.has_unfinished()


def test_logit_bias_forces_and_forbids_tokens(engine):
    prompt = _prompt(engine)
    (free,) = engine.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    first = free.outputs[0].token_ids[0]
    (banned,) = engine.generate(
        [prompt],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logit_bias={first: -100}),
    )
    assert first not in banned.outputs[0].token_ids[:1]
    (forced,) = engine.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logit_bias={42: 100})
    )
    assert forced.outputs[0].token_ids == [42, 42, 42]


@pytest.mark.parametrize("bias", [{-1: 1.0}, {5: 101.0}, {5: float("nan")}])
def test_bad_logit_bias_names_the_field(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)


def test_thinking_splits_streamed_and_whole_alike():
    fmt = reasoning_format("{{ '<think>' }} ... {{ '</think>' }}")
    assert fmt == ReasoningFormat("<think>", "</think>")
    assert reasoning_format("{{ messages }}") is None
    text = "<think>Let me see.</think>\n\nParis."
    assert fmt.split(text) == ("Let me see.", "Paris.")
    splitter = fmt.splitter()
    parts = [splitter.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    parts.append(splitter.feed("", final=True))
    assert ("".join(p[0] for p in parts), "".join(p[1] for p in parts)) == fmt.split(text)
    # a generation prompt that opens the thinking: the reply starts inside it
    assert fmt.split("hmm</think>ok", "<|im_start|>assistant\n<think>\n") == ("hmm", "ok")
    assert fmt.split("a < b", "") == ("", "a < b")


def test_mask_time_is_counted_by_the_clock_it_is_given(engine):
    """A benchmark times the masks by the clock it times the steps by (a share of a step
    measured by two clocks can pass 100%): here a clock that ticks once a reading."""
    ticks = iter(range(10**6))
    engine.constraints.clock = lambda: float(next(ticks))
    before, rows = engine.constraints.mask_seconds, engine.constraints.masked_rows
    try:
        engine.generate(
            [_prompt(engine)], SamplingParams(temperature=0, max_tokens=5, structured=JSON)
        )
    finally:
        engine.constraints.clock = time.perf_counter
    masked_steps = engine.constraints.mask_seconds - before
    assert masked_steps == engine.constraints.masked_rows - rows == 5  # one tick a masked step


def test_forbid_masks_exactly_as_a_boolean_masked_fill():
    gen = torch.Generator().manual_seed(0)
    vocab = 1000  # not a multiple of 32: the last word's high bits lie past the vocabulary
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 32), dtype=torch.int32, generator=gen)
    logits = torch.randn(3, vocab, generator=gen)
    logits[0, :5] = float("-inf")
    want = logits.clone().masked_fill_(~unpack(bitmask, vocab), float("-inf"))
    forbid(logits, bitmask, vocab)
    assert torch.equal(logits, want)
