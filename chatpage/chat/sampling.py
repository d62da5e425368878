"""A chat's sampling settings and how its next reply is asked for (one, samples, or a beam).

The rules of each setting (type, range, how "off" is written) are the engine's
`SAMPLING_RULES`: the settings screen, slash commands, persona files and `SamplingParams` all
check values with that one table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from chatpage.config.personas import Persona
from chatpage.engine.sampling_params import RULE_BY_FIELD, SAMPLING_RULES, SamplingParams

SETTINGS = SAMPLING_RULES
"""The settings a user can change, in the order the settings screen shows them."""
SETTING_BY_FIELD = RULE_BY_FIELD
AltKind = Literal["off", "samples", "beam"]

@dataclass(frozen=True)
class SamplingSettings:
    """A session's decoding settings; they start as the persona's (else these chat defaults,
    a little cooler and longer than the engine's)."""

    temperature: float = 0.7
    top_p: float = RULE_BY_FIELD["top_p"].default
    top_k: int = RULE_BY_FIELD["top_k"].default
    max_tokens: int = 512
    seed: int | None = RULE_BY_FIELD["seed"].default

    @classmethod
    def for_persona(cls, persona: Persona) -> SamplingSettings:
        return cls(**persona.sampling())

    def params(self, **overrides: object) -> SamplingParams:
        """SamplingParams for one request (raises ValueError naming a bad field)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(overrides)
        return SamplingParams(**values)  # type: ignore[arg-type]

    def with_value(self, name: str, raw: str | float | int | None) -> SamplingSettings:
        """A copy with ``name`` set from user input; ValueError names the setting and the rule."""
        return replace(self, **{name: SETTING_BY_FIELD[name].parse(raw)})

    def describe(self) -> str:
        seed = "random" if self.seed is None else str(self.seed)
        top_k = f" · top-k {self.top_k}" if self.top_k else ""
        return (f"temp {self.temperature:g} · top-p {self.top_p:g}{top_k} · "
                f"max {self.max_tokens} · seed {seed}")


@dataclass(frozen=True)
class AltMode:
    """How the next reply is asked for: one reply, n samples, or a beam of width k."""

    kind: AltKind = "off"
    k: int = 3

    def describe(self) -> str:
        if self.kind == "samples":
            return f"{self.k} samples"
        if self.kind == "beam":
            return f"beam width {self.k}"
        return "one reply"
