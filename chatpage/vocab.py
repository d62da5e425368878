"""The words every layer shares: finish reasons, message statuses, roles, weight formats, block
sizes, and `SAMPLING_RULES`, the one table of sampling fields.

A leaf: it imports nothing of chatpage, so the engine, the store, the config, the chat, the
wire format and the UI can all name these without importing each other. Every list of sampling
fields and every sampling default (SamplingParams, a chat's settings, persona keys, slash
commands, `chatpage ask`'s flags, the OpenAI request fields) is derived from the table.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import cast


class UserError(ValueError):
    """Something the user can fix: a bad value, a misused command, a file that cannot be read,
    a model that does not load, a prompt too long for the context window. ``str()`` is one line
    saying what and what to do. The UI shows these as advice; any other exception is a bug (its
    traceback goes to the error log). A ValueError, so callers that take any bad value (the CLI,
    the server's 400 answers) catch these too."""


class SamplingValueError(UserError):
    """A sampling field's value outside its rule (`SAMPLING_RULES`)."""


class FinishReason(enum.StrEnum):
    """Why an output ended. A str: it compares equal to, and stores as, its value."""

    STOP = "stop"  # EOS, a stop token or a stop string
    LENGTH = "length"  # max_tokens or the context window
    ABORT = "abort"  # cancelled
    ERROR = "error"  # could not run (the request's error says why)


class MessageStatus(enum.StrEnum):
    """Where a message stands; stored as its text, so plain strings compare equal."""

    DONE = "done"
    STREAMING = "streaming"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"
    ERROR = "error"


class Role(enum.StrEnum):
    """Who wrote a message."""

    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


WEIGHT_FORMATS = ("fp32", "bf16", "int8", "int4")
"""The storage formats of the matmul weights (``engine/model/weights.py`` implements them)."""
DEFAULT_WEIGHTS = "int4"
"""The app's weight format: the fastest whose quality holds (`chatpage bench single` / `bench
quality`); the engine's own default stays fp32, the exact reference."""
KV_CACHE_DTYPES = ("auto", "bf16", "int8")
"""The KV cache's storage (``--kv-cache-dtype``, vLLM's flag): bf16, int8 (rows of int8 values
and a scale, half the bytes: ``engine/model/attention.py``), or ``auto``, what the engine's plan
picks (``engine/device.py``)."""
DEVICES = ("auto", "cpu", "cuda", "cuda:N")
"""The engine devices a user may name (N: a GPU's index); ``auto`` is the first CUDA GPU torch
sees, else the CPU."""

DEFAULT_DEVICE = "auto"

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""The share of a GPU's memory the engine may fill (weights, activations, the KV pool), as vLLM."""


def check_device_name(name: object) -> str:
    """``name`` normalised ("CUDA:0 " -> "cuda:0") when it is a device of :data:`DEVICES` (or the
    tests' "meta"); ValueError naming the choices otherwise."""
    text = name.strip().lower() if isinstance(name, str) else ""
    kind, colon, index = text.partition(":")
    if text in ("auto", "cpu", "cuda", "meta") or (kind == "cuda" and colon and index.isdigit()):
        return text
    raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N (N a GPU index)")


BLOCK_SIZES = (8, 16, 32)
"""The KV-cache block sizes (tokens per block) the kernels support."""
DEFAULT_BLOCK_SIZE = 16

# -- sampling ---------------------------------------------------------------------------------

OFF_WORDS = ("off", "none", "random", "")
"""What a user may type for a setting that can be off (None), e.g. a random seed."""
MAX_LOGPROBS = 20
"""The most alternatives per generated token a request may ask for (vLLM's default limit)."""
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
GREEDY_BELOW = 1e-5
"""A temperature below this is greedy, as 0 is (vLLM's epsilon): logits divided by less would
overflow the float range, and the distribution is already all on the top token."""

Value = float | int | bool | tuple[str, ...] | tuple[int, ...] | None


@dataclass(frozen=True)
class SamplingRule:
    """One sampling field: its type and range, its defaults and where people set it.

    ``kind`` is int, float or bool, or tuple for a list of ``item``s (non-empty strings, or
    whole numbers >= ``low``), at most ``max_items`` of them, strings of at most ``max_chars``. A number runs from ``low`` (excluded when ``low_open``; None: no
    bound) up to ``high``; ``nullable``: None (typed as "off") turns it off; ``zero_means``:
    what 0 does, for the description.

    ``default`` is SamplingParams' own (the engine's). ``api_default`` is what a request to
    `chatpage serve` that leaves the field out gets, and ``chat_default`` what a chat (and
    `chatpage ask`) gets when its persona leaves it unset; None for either: ``default``.

    ``wire``: the OpenAI request fields that carry it, the one written first (vLLM's extras
    are ``vllm_extra``); ``cli``: `chatpage ask`'s flag; ``slash``: the slash command that sets
    it in a chat. A field with a slash command is a chat setting: a persona file key (its
    field name), a row of the settings screen and a `SamplingSettings` field.
    """

    field: str
    label: str  # how people name it (slash commands, the settings screen, error messages)
    kind: type
    default: Value
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    nullable: bool = False
    zero_means: str | None = None
    item: type | None = None
    max_items: int | None = None
    max_chars: int | None = None
    api_default: Value = None
    chat_default: Value = None
    wire: tuple[str, ...] = ()
    vllm_extra: bool = False
    cli: str | None = None
    slash: str | None = None

    @property
    def for_api(self) -> Value:
        """The value of a `chatpage serve` request that does not set it."""
        return self.default if self.api_default is None else self.api_default

    @property
    def for_chat(self) -> Value:
        """A chat's value when its persona does not set it."""
        return self.default if self.chat_default is None else self.chat_default

    @property
    def allowed(self) -> str:
        """The rule in words, e.g. "a number > 0 and <= 1", or "..., or 'off'"."""
        if not self.nullable:
            return self.values
        return self.values + (
            ", or 'off' for a random one" if self.field == "seed" else ", or 'off'"
        )

    @property
    def values(self) -> str:
        """The values it takes besides "off", in words."""
        if self.kind is bool:
            return "true or false"
        if self.kind is tuple:
            most = f"at most {self.max_items} " if self.max_items is not None else ""
            if self.item is str:
                chars = f" of at most {self.max_chars} characters" if self.max_chars else ""
                return f"a list of {most}non-empty strings{chars}"
            return f"a list of {most}token ids >= {self.low:g}"
        noun = "a whole number" if self.kind is int else "a number"
        text = noun if self.low is None else f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
        if self.high is not None:
            text += f" and <= {self.high:g}"
        if self.zero_means:
            text += f" (0 = {self.zero_means})"
        return text

    def ok(self, value: object) -> bool:
        """Whether `value` (already typed; a list as a list or tuple) passes."""
        if value is None:
            return self.nullable
        if self.kind is bool:
            return isinstance(value, bool)
        if self.kind is tuple:
            if not isinstance(value, list | tuple):
                return False
            if self.max_items is not None and len(value) > self.max_items:
                return False
            if self.item is str:
                return all(
                    isinstance(v, str) and 0 < len(v) <= (self.max_chars or len(v)) for v in value
                )
            return all(_whole(v) and v >= (self.low or 0) for v in value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.kind is int and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high

    def parse(self, raw: str | float | int | None) -> Value:
        """Typed text or a number as this field's value; SamplingValueError names it and the
        rule."""
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
            raise SamplingValueError(f"{self.label} must be {self.allowed}, got {raw!r}")
        return cast(Value, value)  # ok() checked it


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


SAMPLING_RULES: tuple[SamplingRule, ...] = (
    SamplingRule("n", "samples", int, 1, 1, wire=("n",), cli="--n"),
    SamplingRule(
        "beam_width",
        "beam width",
        int,
        0,
        0,
        zero_means="no beam search",
        wire=("n", "use_beam_search"),
        cli="--beam",
    ),
    # a chat runs a little cooler and longer than the engine's defaults; an API request
    # without max_tokens wants a whole answer
    SamplingRule(
        "temperature",
        "temperature",
        float,
        1.0,
        0,
        zero_means="greedy",
        chat_default=0.7,
        wire=("temperature",),
        cli="--temperature",
        slash="temp",
    ),
    SamplingRule(
        "top_p",
        "top-p",
        float,
        1.0,
        0,
        low_open=True,
        high=1,
        wire=("top_p",),
        cli="--top-p",
        slash="top_p",
    ),
    SamplingRule("top_k", "top-k", int, 0, 0, zero_means="off", wire=("top_k",), slash="top_k"),
    SamplingRule(
        "max_tokens",
        "max tokens",
        int,
        256,
        1,
        api_default=1024,
        chat_default=512,
        wire=("max_tokens", "max_completion_tokens"),
        cli="--max-tokens",
        slash="max",
    ),
    SamplingRule(
        "seed", "seed", int, None, 0, nullable=True, wire=("seed",), cli="--seed", slash="seed"
    ),
    # each is looked for in the new text of every step: a few, short (OpenAI allows 4)
    SamplingRule(
        "stop",
        "stop strings",
        tuple,
        (),
        item=str,
        max_items=MAX_STOP_STRINGS,
        max_chars=MAX_STOP_CHARS,
        wire=("stop",),
    ),
    SamplingRule(
        "stop_token_ids",
        "stop token ids",
        tuple,
        (),
        0,
        item=int,
        wire=("stop_token_ids",),
        vllm_extra=True,
    ),
    SamplingRule("ignore_eos", "ignore EOS", bool, False, wire=("ignore_eos",), vllm_extra=True),
    SamplingRule(
        "length_penalty", "length penalty", float, 1.0, wire=("length_penalty",), vllm_extra=True
    ),
    # once on, how many alternatives besides the sampled token (0: that token's only)
    SamplingRule(
        "logprobs",
        "logprobs",
        int,
        None,
        0,
        high=MAX_LOGPROBS,
        nullable=True,
        wire=("logprobs", "top_logprobs"),
    ),
)
RULE_BY_FIELD = {rule.field: rule for rule in SAMPLING_RULES}
CHAT_SETTINGS = tuple(rule for rule in SAMPLING_RULES if rule.slash)
"""The sampling settings of a chat, in the order the settings screen shows them."""
