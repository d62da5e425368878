"""Request fields <-> `SamplingParams`, both ways: `read_sampling` (the server's side) and
`write_sampling` (the client's), inverse functions over the table's wire names.

Field names are the OpenAI API's plus vLLM's extras (``top_k``, ``use_beam_search``,
``length_penalty``, ``ignore_eos``, ``stop_token_ids``). Value ranges are `SamplingParams`'
own checks (the sampling-rule table), reported under the request's field names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import RULE_BY_FIELD, SAMPLING_RULES, SamplingRule
from chatpage.wire.errors import ApiError, bad_value
from chatpage.wire.structured import read_structured, write_structured

VLLM_TOP_K_OFF = -1
"""top_k "off" as vLLM (and SGLang) write it; chatpage reads it as 0."""
BEAM_SEARCH_VALUES = {"temperature": 0.0, "top_p": 1.0, "top_k": 0}
"""What beam search has of the sampling fields it does not use: a client sends them so (vLLM
refuses beam search with others; top_k as its default, left out), a server reads them so."""
_SPECIAL = ("n", "beam_width", "logprobs")  # not one wire field each: see below
_PLAIN = tuple(rule for rule in SAMPLING_RULES if rule.field not in _SPECIAL)


@dataclass(frozen=True)
class Dialect:
    """How one server wants the fields a client sets (`remote.backend` picks it per server):
    ``top_k_off``, top_k "off" as the server writes it (None: leave the field out);
    ``vllm_extras``, it takes vLLM's extra fields; ``tokens_as_ids``, it names logprobs'
    tokens "token_id:N" when asked (vLLM's return_tokens_as_token_ids)."""

    top_k_off: int | None = 0
    vllm_extras: bool = True
    tokens_as_ids: bool = True


CHATPAGE = Dialect()
"""`chatpage serve`'s own dialect."""


# -- the server's side: a request body -> SamplingParams ----------------------------------------


def _given(body: dict[str, Any], rule: SamplingRule) -> tuple[str, Any]:
    """(the wire name, the value) a body sets ``rule``'s field with; the newest name first
    (max_completion_tokens over max_tokens); the value None when it does not."""
    for name in reversed(rule.wire):
        if body.get(name) is not None:
            return name, body[name]
    return rule.wire[0], None


def read_flag(body: dict[str, Any], name: str) -> bool:
    """A true/false field (None and absent: false); a 400 for anything else."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_value(name, "true or false", value)
    return value


def _logprobs(body: dict[str, Any], kind: str) -> tuple[str, Any]:
    """(the wire name, `SamplingParams.logprobs`) as a request asks (None: no logprobs). Chat:
    ``logprobs: true`` and ``top_logprobs: N`` alternatives per token; completions:
    ``logprobs: N`` (0 = the sampled token's only). The range is SamplingParams' own check."""
    name = "top_logprobs" if kind == "chat" else "logprobs"
    count = body.get(name)
    if isinstance(count, bool):  # a bool is an int to Python, not here
        raise bad_value(name, "an integer", count)
    if kind != "chat":
        return name, count
    if not read_flag(body, "logprobs"):
        if count:
            raise ApiError(
                400,
                f"top_logprobs needs logprobs: true, got top_logprobs {count!r} without it",
                "top_logprobs",
            )
        return name, None
    return name, 0 if count is None else count


def _logit_bias(raw: Any, vocab_size: int | None) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (as JSON keys, strings of ASCII digits) -> a bias from
    -100 to 100 (the range is SamplingParams' own check); with ``vocab_size``, each id below
    it (a 400 names any other)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise bad_value("logit_bias", 'an object of token id -> bias, such as {"50256": -100}', raw)
    bias: dict[int, float] = {}
    for key, value in raw.items():
        # (str.isdigit takes "²" and other digits int() refuses; and no vocabulary is that long)
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 12):
            shown = key if len(key) <= 24 else key[:24] + "..."
            raise ApiError(
                400,
                f"logit_bias keys must be token ids (0, 1, 2, ...), got {shown!r}",
                "logit_bias",
            )
        token = int(key)
        if vocab_size is not None and token >= vocab_size:
            raise ApiError(
                400,
                f"logit_bias names token {token}, which is not in the model's vocabulary "
                f"(ids 0 to {vocab_size - 1})",
                "logit_bias",
            )
        bias[token] = value
    return bias


def read_sampling(
    body: dict[str, Any],
    kind: str,
    defaults: dict[str, Any] | None = None,
    vocab_size: int | None = None,
) -> SamplingParams:
    """The SamplingParams of a request body of kind "chat" or "completion"; ``defaults``
    (a persona's sampling settings) fill what the body leaves out, before the table's API
    defaults do; ``vocab_size``: the model's, which token ids must be below. Raises
    `ApiError` 400 naming the request's field."""
    defaults = defaults or {}
    names: dict[str, str] = {}  # SamplingParams' field -> the request field that set it
    values: dict[str, Any] = {}
    for rule in _PLAIN:
        names[rule.field], value = _given(body, rule)
        values[rule.field] = next(
            (v for v in (value, defaults.get(rule.field)) if v is not None), rule.for_api
        )
    if values["top_k"] == VLLM_TOP_K_OFF:
        values["top_k"] = 0
    _, n = _given(body, RULE_BY_FIELD["n"])
    n = RULE_BY_FIELD["n"].for_api if n is None else n
    beam = read_flag(body, "use_beam_search")
    values.update(n=1 if beam else n, beam_width=n if beam else 0)
    if beam:
        values.update(BEAM_SEARCH_VALUES)
    names.update(n="n", beam_width="n")
    names["logprobs"], values["logprobs"] = _logprobs(body, kind)
    values["logit_bias"] = _logit_bias(body.get("logit_bias"), vocab_size)
    values["structured"] = read_structured(body)
    try:
        return SamplingParams(**values)
    except ValueError as e:
        text = str(e).removeprefix("SamplingParams.")
        field = text.split(" ", 1)[0]
        api = names.get(field, field)
        raise ApiError(400, api + text[len(field) :], api) from None


# -- the client's side: SamplingParams -> request fields ----------------------------------------


def write_sampling(
    params: SamplingParams, kind: str, dialect: Dialect = CHATPAGE
) -> dict[str, Any]:
    """Every sampling field of ``params`` as request fields for a server speaking ``dialect``,
    sent explicitly: servers fill unset ones from the model's generation config, which would
    make a reply differ from what the user set (beam search: `BEAM_SEARCH_VALUES`)."""
    beam = params.use_beam_search
    body: dict[str, Any] = {"n": params.width}
    for rule in _PLAIN:
        value = getattr(params, rule.field)
        if rule.vllm_extra and not dialect.vllm_extras:
            continue
        if beam and rule.field in BEAM_SEARCH_VALUES:
            value = None if rule.field == "top_k" else BEAM_SEARCH_VALUES[rule.field]
        elif rule.field == "top_k" and value == 0:
            value = dialect.top_k_off
        if value is not None:
            body[rule.wire[0]] = list(value) if isinstance(value, list) else value
    if beam and dialect.vllm_extras:
        body["use_beam_search"] = True
    if params.logprobs is not None:
        if kind == "completion":
            body["logprobs"] = params.logprobs
        else:
            body.update(logprobs=True, top_logprobs=params.logprobs)
        if dialect.tokens_as_ids:  # alternatives come back by id, not as text
            body["return_tokens_as_token_ids"] = True
    if params.logit_bias:
        body["logit_bias"] = {str(t): b for t, b in params.logit_bias.items()}
    if params.structured is not None:
        body.update(write_structured(params.structured))
    return body
