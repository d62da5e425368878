"""SamplingParams: how one request is decoded. Validated on construction by the sampling-rule
table (`chatpage.vocab.SAMPLING_RULES`), which also holds every field's default."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from chatpage.vocab import GREEDY_BELOW, RULE_BY_FIELD, SAMPLING_RULES, SamplingValueError

MAX_LOGIT_BIAS = 100.0
"""The largest bias (either sign) a token may get, as in OpenAI's API."""
MAX_LOGPROB_ENTRIES = 1 << 18
"""The most log-probabilities one request may ask for, n x max_tokens x (top_logprobs + 1):
about 20 MB of JSON, where nothing bounded 16 samples x 8k tokens x 21 (2.8M: gigabytes held
by the server)."""


class GrammarKind(enum.StrEnum):
    """What a `Structured` spec is written in."""

    JSON_SCHEMA = "json_schema"  # a JSON schema, as JSON text
    JSON_OBJECT = "json_object"  # any JSON object (the spec is unused)
    REGEX = "regex"
    CHOICE = "choice"  # a JSON list of the strings allowed
    GRAMMAR = "grammar"  # a Lark grammar (llguidance's dialect) or a GBNF one


@dataclass(frozen=True, slots=True)
class Structured:
    """A grammar every output of a request must follow (constrained decoding): ``kind`` and
    its ``spec`` text. Equal specs share one compiled grammar (`chatpage.engine.text.grammar`)."""

    kind: GrammarKind
    spec: str = ""


def _default(name: str) -> Any:  # typed by the field it defaults
    return RULE_BY_FIELD[name].default


@dataclass
class SamplingParams:
    """Decoding settings of one request; its fields are the rows of `SAMPLING_RULES`.

    ``n`` parallel samples share the prompt's KV blocks; ``beam_width`` > 1 turns on beam search
    (then temperature/top_k/top_p are unused). ``logprobs`` as in vLLM: None (or False) returns
    none, 0 (or True) the sampled token's log-probability per generated token, N also the N most
    likely tokens' at each step (at most `MAX_LOGPROBS`; under beam search, per beam). Invalid
    values raise ``SamplingValueError`` naming the field.
    """

    n: int = _default("n")
    beam_width: int = _default("beam_width")
    temperature: float = _default("temperature")
    top_p: float = _default("top_p")
    top_k: int = _default("top_k")  # 0 = off
    max_tokens: int = _default("max_tokens")
    seed: int | None = _default("seed")
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = _default("ignore_eos")
    length_penalty: float = _default("length_penalty")
    logprobs: int | None = _default("logprobs")
    # outside the rule table (no persona key or slash command): a request's own
    structured: Structured | None = None  # a grammar the output must follow
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    # speculative decoding (engine/core/speculate.py): whether it may draft, and token lists it
    # drafts from besides its own context (the other versions of a chat turn)
    speculate: bool = True
    draft_source: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.logprobs, bool):  # True: the sampled token's only; False: none
            self.logprobs = 0 if self.logprobs else None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for rule in SAMPLING_RULES:
            value = getattr(self, rule.field)
            if not rule.ok(value):
                raise SamplingValueError(
                    f"SamplingParams.{rule.field} must be {rule.allowed}, got {value!r}"
                )
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.structured is not None and not isinstance(self.structured, Structured):
            raise ValueError(
                f"SamplingParams.structured must be a Structured or None, got {self.structured!r}"
            )
        for token, bias in self.logit_bias.items():
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(
                    f"SamplingParams.logit_bias keys must be token ids >= 0, got {token!r}"
                )
            if (
                isinstance(bias, bool)
                or not isinstance(bias, int | float)
                or not math.isfinite(bias)
                or abs(bias) > MAX_LOGIT_BIAS
            ):
                raise ValueError(
                    f"SamplingParams.logit_bias values must be numbers from "
                    f"-{MAX_LOGIT_BIAS:g} to {MAX_LOGIT_BIAS:g}, got {bias!r} "
                    f"for token {token}"
                )
        if self.use_beam_search and self.n > 1:
            raise SamplingValueError(
                "SamplingParams: use n (parallel samples) or beam_width (beam search), not both"
            )

    @property
    def use_beam_search(self) -> bool:
        return self.beam_width > 1

    @property
    def top_logprobs(self) -> int:
        """How many most likely tokens to report per generated token (0: none)."""
        return self.logprobs or 0

    @property
    def greedy(self) -> bool:
        """Picks the top token: temperature 0 (or below `GREEDY_BELOW`), or top_k 1."""
        return self.temperature < GREEDY_BELOW or self.top_k == 1

    @property
    def width(self) -> int:
        """How many sequences the request runs at once after its prefill."""
        return self.beam_width if self.use_beam_search else self.n
