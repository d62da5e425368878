"""SamplingParams: how one request is decoded. Validated on construction.

`SAMPLING_RULES` is the one table of the user-facing sampling parameters (temperature, top-p,
top-k, max tokens, seed): their type, range, default and how "off" is written. SamplingParams
checks them with it, and so do persona files and the chat's settings (which import it from here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

OFF_WORDS = ("off", "none", "random", "")
"""What a user may type for a setting that can be off (None), e.g. a random seed."""


@dataclass(frozen=True)
class SamplingRule:
    """One sampling parameter: a whole number or a number from `low` (excluded when
    `low_open`) up to `high`; `nullable`: None (typed as "off") turns it off; `zero_means`:
    what 0 does, for the description."""

    field: str
    label: str  # how people name it (slash commands, the settings screen, persona files)
    kind: type  # int or float
    default: float | int | None
    low: float
    low_open: bool = False
    high: float | None = None
    nullable: bool = False
    zero_means: str | None = None

    @property
    def allowed(self) -> str:
        """The rule in words, e.g. "a number > 0 and <= 1"."""
        noun = "a whole number" if self.kind is int else "a number"
        text = f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            text += f" and <= {self.high:g}"
        if self.zero_means:
            text += f" (0 = {self.zero_means})"
        if self.nullable:
            text += ", or 'off' for a random one" if self.field == "seed" else ", or 'off'"
        return text

    def ok(self, value: object) -> bool:
        """Whether `value` (already typed) passes."""
        if value is None:
            return self.nullable
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value) or value < self.low or (self.low_open and value == self.low):
            return False
        return self.high is None or value <= self.high

    def parse(self, raw: str | float | int | None) -> float | int | None:
        """Typed text or a number as this parameter's value; ValueError names it and the rule."""
        value: object = raw
        if isinstance(raw, str):
            text = raw.strip()
            if self.nullable and text.lower() in OFF_WORDS:
                return None
            try:
                value = float(text) if self.kind is float else int(text, 10)
            except ValueError:
                value = text
        elif self.kind is float and isinstance(raw, int) and not isinstance(raw, bool):
            value = float(raw)
        if not self.ok(value):
            raise ValueError(f"{self.label} must be {self.allowed}, got {raw!r}")
        return value


SAMPLING_RULES: tuple[SamplingRule, ...] = (
    SamplingRule("temperature", "temperature", float, 1.0, 0, zero_means="greedy"),
    SamplingRule("top_p", "top-p", float, 1.0, 0, low_open=True, high=1),
    SamplingRule("top_k", "top-k", int, 0, 0, zero_means="off"),
    SamplingRule("max_tokens", "max tokens", int, 256, 1),
    SamplingRule("seed", "seed", int, None, 0, nullable=True),
)
RULE_BY_FIELD = {rule.field: rule for rule in SAMPLING_RULES}

MAX_LOGPROBS = 20
"""The most alternatives per generated token a request may ask for (vLLM's default limit)."""
LOGPROBS_RULE = SamplingRule("logprobs", "logprobs", int, None, 0, high=MAX_LOGPROBS)
"""SamplingParams.logprobs once on: how many alternatives besides the sampled token (an API
setting, not a chat one, so it is not in SAMPLING_RULES)."""


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    ``n`` parallel samples share the prompt's KV blocks; ``beam_width`` > 1 turns on beam search
    (then temperature/top_k/top_p are unused). ``logprobs`` as in vLLM: None (or False) returns
    none, 0 (or True) the sampled token's log-probability per generated token, N also the N most
    likely tokens' at each step (at most `MAX_LOGPROBS`; under beam search, per beam). Invalid
    values raise ``ValueError`` naming the field.
    """

    n: int = 1
    beam_width: int = 0
    temperature: float = RULE_BY_FIELD["temperature"].default
    top_k: int = RULE_BY_FIELD["top_k"].default  # 0 = off
    top_p: float = RULE_BY_FIELD["top_p"].default
    seed: int | None = RULE_BY_FIELD["seed"].default
    max_tokens: int = RULE_BY_FIELD["max_tokens"].default
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    length_penalty: float = 1.0
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.logprobs, bool):  # True: the sampled token's only; False: none
            self.logprobs = 0 if self.logprobs else None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        checks = [
            ("n", isinstance(self.n, int) and self.n >= 1, "an integer >= 1"),
            ("beam_width", isinstance(self.beam_width, int) and self.beam_width >= 0,
             "an integer >= 0 (0 or 1 = no beam search)"),
            *((rule.field, rule.ok(getattr(self, rule.field)), rule.allowed)
              for rule in SAMPLING_RULES),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "a list of non-empty strings"),
            ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "a list of token ids >= 0"),
            ("length_penalty", _number(self.length_penalty), "a number"),
            ("logprobs", self.logprobs is None or LOGPROBS_RULE.ok(self.logprobs),
             LOGPROBS_RULE.allowed),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} must be {allowed}, got {getattr(self, name)!r}")
        if self.use_beam_search and self.n > 1:
            raise ValueError(
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
        return self.temperature == 0 or self.top_k == 1

    @property
    def width(self) -> int:
        """How many sequences the request runs at once after its prefill."""
        return self.beam_width if self.use_beam_search else self.n


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
