"""The OpenAI wire both ways (chatpage.wire): what the client writes the server reads back the
same, and the other way round, as hypothesis round trips; and the module stays free of torch,
Starlette and httpx."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatpage.engine.outputs import OutputDelta, Usage
from chatpage.engine.sampling_params import GrammarKind, SamplingParams, Structured
from chatpage.vocab import CHAT_SETTINGS, MAX_LOGPROBS, FinishReason
from chatpage.wire.chunks import ChunkWriter, read_choice, read_usage, sse, sse_data, usage_body
from chatpage.wire.requests import ApiRequest, parse_request, request_body
from chatpage.wire.sampling import CHATPAGE, Dialect, read_sampling, write_sampling

VLLM = Dialect(top_k_off=-1, vllm_extras=True, tokens_as_ids=True)
DIALECTS = st.sampled_from([CHATPAGE, VLLM])  # the ones that carry every field
KINDS = st.sampled_from(["chat", "completion"])
probability = st.floats(min_value=0.01, max_value=1.0)
temperature = st.floats(min_value=0.0, max_value=4.0)
seeds = st.none() | st.integers(0, 2**40)
stops = st.lists(st.text(min_size=1, max_size=4), max_size=3)
token_ids = st.lists(st.integers(0, 50_000), max_size=3)
logprob_counts = st.none() | st.integers(0, MAX_LOGPROBS)
structured = st.none() | st.sampled_from(
    [
        Structured(GrammarKind.JSON_OBJECT),
        Structured(
            GrammarKind.JSON_SCHEMA,
            json.dumps({"properties": {"a": {"type": "integer"}}, "type": "object"}),
        ),
        Structured(GrammarKind.REGEX, "[0-9]{3}"),
        Structured(GrammarKind.CHOICE, json.dumps(["yes", "no"])),
        Structured(GrammarKind.GRAMMAR, 'start: "a" | "b"'),
    ]
)
biases = st.dictionaries(st.integers(0, 50_000), st.floats(-100.0, 100.0), max_size=2)


@st.composite
def sampling_params(draw: st.DrawFn) -> SamplingParams:
    """Any SamplingParams the wire carries: beam search with what it does not use at their
    beam values (the client sends those)."""
    common = dict(
        max_tokens=draw(st.integers(1, 4096)),
        seed=draw(seeds),
        stop=draw(stops),
        stop_token_ids=draw(token_ids),
        ignore_eos=draw(st.booleans()),
        logprobs=draw(logprob_counts),
        length_penalty=draw(st.floats(-2.0, 2.0)),
        structured=draw(structured),
        logit_bias=draw(biases),
    )
    if draw(st.booleans()):
        return SamplingParams(
            beam_width=draw(st.integers(2, 6)), temperature=0.0, top_p=1.0, **common
        )
    return SamplingParams(
        n=draw(st.integers(1, 6)),
        temperature=draw(temperature),
        top_p=draw(probability),
        top_k=draw(st.integers(0, 100)),
        **common,
    )


def _maybe(draw: st.DrawFn, body: dict, name: str, values: st.SearchStrategy) -> None:
    if draw(st.booleans()):
        body[name] = draw(values)


@st.composite
def request_bodies(draw: st.DrawFn, kind: str) -> dict:
    """Bodies as any client may write them: fields left out, set to null, the newer and older
    names of max tokens, one stop string, vLLM's top_k -1 for "off"."""
    body: dict = {}
    beam = draw(st.booleans())
    if beam:
        body.update(use_beam_search=True, n=draw(st.integers(2, 6)))
        _maybe(draw, body, "temperature", st.just(0.0))
        _maybe(draw, body, "top_p", st.just(1.0))
        _maybe(draw, body, "top_k", st.sampled_from([-1, 0]))
    else:
        _maybe(draw, body, "n", st.integers(1, 6) | st.none())
        _maybe(draw, body, "temperature", temperature | st.none())
        _maybe(draw, body, "top_p", probability)
        _maybe(draw, body, "top_k", st.integers(-1, 100))
    _maybe(
        draw,
        body,
        draw(st.sampled_from(["max_tokens", "max_completion_tokens"])),
        st.integers(1, 4096),
    )
    _maybe(draw, body, "seed", seeds)
    _maybe(draw, body, "stop", stops | st.text(min_size=1, max_size=4))
    _maybe(draw, body, "stop_token_ids", token_ids)
    _maybe(draw, body, "ignore_eos", st.booleans())
    _maybe(draw, body, "length_penalty", st.floats(-2.0, 2.0))
    count = draw(logprob_counts)
    if count is not None and kind == "chat":
        body["logprobs"] = True
        _maybe(draw, body, "top_logprobs", st.just(count))
    elif count is not None:
        body["logprobs"] = count
    return body


persona_defaults = st.fixed_dictionaries(
    {},
    optional={
        "temperature": temperature,
        "top_p": probability,
        "top_k": st.integers(0, 100),
        "max_tokens": st.integers(1, 4096),
        "seed": st.integers(0, 100),
    },
)


@given(sampling_params(), KINDS, DIALECTS)
def test_params_to_body_to_params(params, kind, dialect) -> None:
    body = json.loads(json.dumps(write_sampling(params, kind, dialect)))
    assert read_sampling(body, kind) == params


@given(st.data(), KINDS, persona_defaults, DIALECTS)
def test_body_to_params_to_body(data, kind, defaults, dialect) -> None:
    """A body means what its rewrite means; the rewrite (every field explicit) is a fixed
    point."""
    params = read_sampling(data.draw(request_bodies(kind)), kind, defaults)
    body = write_sampling(params, kind, dialect)
    assert read_sampling(body, kind) == params
    assert write_sampling(read_sampling(body, kind), kind, dialect) == body


def test_the_table_fills_what_a_body_leaves_out() -> None:
    params = read_sampling({}, "chat")
    assert (params.max_tokens, params.temperature, params.top_k) == (1024, 1.0, 0)
    persona = {s.field: s.for_chat for s in CHAT_SETTINGS}
    assert read_sampling({}, "chat", persona).max_tokens == persona["max_tokens"] == 512
    assert read_sampling({"max_tokens": 3}, "chat", persona).max_tokens == 3
    beam = read_sampling({"n": 2, "use_beam_search": True, "temperature": 0.9}, "chat", persona)
    assert (beam.beam_width, beam.n, beam.temperature, beam.top_p) == (2, 1, 0.0, 1.0)


@given(KINDS | st.just("continue"), sampling_params(), st.text(min_size=1, max_size=8))
def test_a_client_request_parses_back_to_what_it_asked(kind, params, text) -> None:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "so"}]
    payload = "go on" if kind == "completion" else messages
    body = json.loads(json.dumps(request_body("m", kind, payload, params)))
    api = parse_request(body, "completion" if kind == "completion" else "chat")
    assert (api.model, api.params, api.stream) == ("m", params, not params.use_beam_search)
    assert api.include_usage == api.stream and api.tokens_as_ids == (params.logprobs is not None)
    assert (api.prompt if kind == "completion" else api.messages) == payload
    assert api.continue_final_message == (kind == "continue")


# -- chunks -------------------------------------------------------------------------------------

VOCAB = {i: text for i, text in enumerate(["a", "b", " c", "dé", "€", "\n", "", "xyz"])}
logprob = st.floats(min_value=-30.0, max_value=0.0)


@st.composite
def steps(draw: st.DrawFn, count: int | None) -> tuple[int, float, dict[int, float] | None]:
    """One generated token as the engine reports it: its id and logprob, and the ``count``
    most likely tokens best first (distinct values; the sampled one among them or below)."""
    values = sorted(
        draw(st.lists(logprob, min_size=len(VOCAB), max_size=len(VOCAB), unique=True)), reverse=True
    )
    ranked = draw(st.permutations(list(VOCAB)))
    dist = dict(zip(ranked, values, strict=True))
    token = draw(st.sampled_from(ranked))
    tops = {t: dist[t] for t in ranked[:count]} if count else None
    return token, dist[token], tops


@st.composite
def deltas(draw: st.DrawFn, count: int | None, index: int) -> OutputDelta:
    drawn = draw(st.lists(steps(count), max_size=4))
    ids = tuple(t for t, _, _ in drawn)
    asked = count is not None
    return OutputDelta(
        index=index,
        text="".join(VOCAB[t] for t in ids),
        token_ids=ids if asked else (),
        logprobs=tuple(lp for _, lp, _ in drawn) if asked else None,
        # none for a step without tokens: the wire cannot tell empty from absent
        top_logprobs=tuple(top for _, _, top in drawn) if count and drawn else None,
        finish_reason=draw(st.none() | st.sampled_from(FinishReason)),
    )


def _writer(kind: str, count: int | None, include_usage: bool = False) -> ChunkWriter:
    request = ApiRequest(
        kind, "m", SamplingParams(logprobs=count), include_usage=include_usage, tokens_as_ids=True
    )
    return ChunkWriter(request, "id-1", "m", 7, lambda t: VOCAB[t])


def _framed(chunk: dict) -> dict:
    (line, blank, end) = sse(chunk).split("\n")
    assert blank == end == ""
    data = sse_data(line)
    assert data is not None
    return json.loads(data)


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
@given(st.data(), KINDS, logprob_counts, st.booleans())
def test_delta_to_chunk_to_delta_to_chunk(data, kind, count, include_usage) -> None:
    """Streamed: what a writer makes of the deltas of several choices reads back as those
    deltas, and a second writer makes the same chunks of what was read."""
    chat = kind == "chat"
    sent = data.draw(st.lists(st.integers(0, 2).flatmap(lambda i: deltas(count, i)), max_size=6))
    writer, again = _writer(kind, count, include_usage), _writer(kind, count, include_usage)
    for delta in sent:
        chunks = [_framed(c) for c in writer.chunks(delta)]
        *opening, last = chunks
        assert all(
            c["choices"][0]["delta"] == {"role": "assistant", "content": ""} for c in opening
        ) and len(opening) <= int(chat)
        assert ("usage" in last) == include_usage
        (choice,) = last["choices"]
        read = read_choice(choice, chat, count or 0)
        assert read == delta
        assert [_framed(c) for c in again.chunks(read)] == chunks


@given(st.data(), KINDS, logprob_counts)
def test_whole_answer_to_outputs_to_whole_answer(data, kind, count) -> None:
    outputs = [data.draw(deltas(count, i)) for i in range(data.draw(st.integers(1, 3)))]
    usage = Usage(*data.draw(st.lists(st.integers(0, 5000), min_size=3, max_size=3)))
    body = _framed(_writer(kind, count).whole(outputs, usage))
    read = [read_choice(c, kind == "chat", count or 0) for c in body["choices"]]
    assert read == outputs and read_usage(body["usage"]) == usage
    assert _framed(_writer(kind, count).whole(read, read_usage(body["usage"]))) == body


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6))
def test_usage_round_trip(prompt, cached, completion) -> None:
    usage = Usage(prompt, cached, completion)
    assert read_usage(usage_body(usage)) == usage


def test_the_wire_imports_no_torch_starlette_or_httpx() -> None:
    code = (
        "import sys, chatpage.wire.requests, chatpage.wire.chunks; "
        "print(sorted({'torch', 'starlette', 'httpx'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
