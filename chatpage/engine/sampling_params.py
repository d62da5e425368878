"""SamplingParams: how one request is decoded. Validated on construction by the sampling-rule
table (`chatpage.vocab.SAMPLING_RULES`), which also holds every field's default."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatpage.vocab import GREEDY_BELOW, RULE_BY_FIELD, SAMPLING_RULES, SamplingValueError


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

    def __post_init__(self) -> None:
        if isinstance(self.logprobs, bool):  # True: the sampled token's only; False: none
            self.logprobs = 0 if self.logprobs else None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for rule in SAMPLING_RULES:
            value = getattr(self, rule.field)
            if not rule.ok(value):
                raise SamplingValueError(f"SamplingParams.{rule.field} must be {rule.allowed}, "
                                 f"got {value!r}")
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
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
