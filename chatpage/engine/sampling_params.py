"""SamplingParams: how one request is decoded. Validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    """Decoding settings of one request.

    ``n`` parallel samples share the prompt's KV blocks; ``beam_width`` > 1 turns on beam search
    (then temperature/top_k/top_p are unused). Invalid values raise ``ValueError`` naming the field.
    """

    n: int = 1
    beam_width: int = 0
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int | None = None
    max_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    length_penalty: float = 1.0
    logprobs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_token_ids = list(self.stop_token_ids)
        checks = [
            ("n", isinstance(self.n, int) and self.n >= 1, "an integer >= 1"),
            ("beam_width", isinstance(self.beam_width, int) and self.beam_width >= 0,
             "an integer >= 0 (0 or 1 = no beam search)"),
            ("temperature", _number(self.temperature) and self.temperature >= 0, "a number >= 0"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= 0, "an integer >= 0 (0 = off)"),
            ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "a number in (0, 1]"),
            ("seed", self.seed is None or isinstance(self.seed, int), "an integer or None"),
            ("max_tokens", isinstance(self.max_tokens, int) and self.max_tokens >= 1,
             "an integer >= 1"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "a list of non-empty strings"),
            ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "a list of token ids >= 0"),
            ("length_penalty", _number(self.length_penalty), "a number"),
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
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def width(self) -> int:
        """How many sequences the request runs at once after its prefill."""
        return self.beam_width if self.use_beam_search else self.n


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
