"""A chat's sampling settings and how its next reply is asked for (one, samples, or a beam).

The settings, and each one's rule (type, range, default, how "off" is written), are the chat
settings of `chatpage.vocab.SAMPLING_RULES`: the settings screen, slash commands, persona files
and `SamplingParams` all check values with that one table.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from chatpage.config.personas import Persona
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import CHAT_SETTINGS

SETTINGS = CHAT_SETTINGS
"""The settings a user can change, in the order the settings screen shows them."""
SETTING_BY_FIELD = {rule.field: rule for rule in SETTINGS}
AltKind = Literal["off", "samples", "beam", "compare"]


def _chat_default(name: str) -> Any:  # typed by the field it defaults
    return SETTING_BY_FIELD[name].for_chat


@dataclass(frozen=True)
class SamplingSettings:
    """A session's decoding settings (the fields of `SETTINGS`); they start as the persona's,
    else as the table's chat defaults."""

    temperature: float = _chat_default("temperature")
    top_p: float = _chat_default("top_p")
    top_k: int = _chat_default("top_k")
    max_tokens: int = _chat_default("max_tokens")
    seed: int | None = _chat_default("seed")

    @classmethod
    def for_persona(cls, persona: Persona) -> SamplingSettings:
        return cls(**persona.sampling())

    def params(self, **overrides: object) -> SamplingParams:
        """SamplingParams for one request (raises SamplingValueError naming a bad field)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(overrides)
        return SamplingParams(**values)

    def with_value(self, name: str, raw: str | float | int | None) -> SamplingSettings:
        """A copy with ``name`` set from user input; SamplingValueError names the setting and
        the rule."""
        change: dict[str, Any] = {name: SETTING_BY_FIELD[name].parse(raw)}  # checked by the rule
        return replace(self, **change)

    def describe(self) -> str:
        seed = "random" if self.seed is None else str(self.seed)
        top_k = f" · top-k {self.top_k}" if self.top_k else ""
        return (
            f"temp {self.temperature:g} · top-p {self.top_p:g}{top_k} · "
            f"max {self.max_tokens} · seed {seed}"
        )


@dataclass(frozen=True)
class AltMode:
    """How the next reply is asked for: one reply, n samples, a beam of width k, or once per
    value of one setting (``compare``: ``setting`` and its ``values``)."""

    kind: AltKind = "off"
    k: int = 3
    setting: str = ""
    values: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.kind == "samples":
            return f"{self.k} samples"
        if self.kind == "beam":
            return f"beam width {self.k}"
        if self.kind == "compare":
            return f"compare {setting_name(self.setting)}={','.join(self.values)}"
        return "one reply"


def setting_name(field: str) -> str:
    """How the user names a setting (its slash command: ``temp`` for temperature)."""
    return SETTING_BY_FIELD[field].slash or field


def compare_labels(sampling: SamplingSettings, name: str, values: list[str]) -> list[str]:
    """The pane titles of a comparison of setting ``name`` (``temp=0.2``); ValueError names
    a value that is not allowed."""
    return [
        f"{setting_name(name)}={getattr(sampling.with_value(name, raw), name)}" for raw in values
    ]
