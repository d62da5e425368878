"""The model's architecture as the engine reads it, from config.json, fast.

transformers' own config classes cost about a second to import on the reference machine (the Llama
config module pulls in torch.distributed), a third of the cached start-up. A config.json that states
every field the engine reads, with plain RoPE and no sliding window, is read here into a
:class:`ModelConfig` with those values as written; anything that needs transformers to interpret it
(RoPE scaling, defaults for missing fields, sliding windows) goes through ``AutoConfig`` as before.
The engine reads configs by attribute, so either kind works everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Fields a config.json must state for the fast path; with these missing, transformers' defaults
# (which differ by model type) decide, so AutoConfig reads the file.
REQUIRED = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eos_token_id",
)


class ModelShape(Protocol):
    """What the engine reads of any model's config: a :class:`ModelConfig`, or a transformers
    PretrainedConfig, which has these and more (the optional fields, such as ``head_dim`` or
    ``sliding_window``, are read with getattr)."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_hidden_layers(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...
    @property
    def eos_token_id(self) -> int | list[int] | None: ...


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The fields of a Llama-family config.json that the engine uses."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_id: int | list[int] | None
    rope_parameters: dict[str, Any]
    head_dim: int | None = None
    sliding_window: int | None = None


def plain_rope(raw: dict[str, Any]) -> dict[str, Any] | None:
    """``{"rope_type": "default", "rope_theta": θ}`` when ``raw`` asks for unscaled RoPE with an
    explicit base, in either the current (``rope_parameters``) or older (``rope_theta`` plus
    ``rope_scaling``) spelling; None when it asks for anything else."""
    params = raw.get("rope_parameters")
    if params is None:
        if raw.get("rope_scaling") is not None or "rope_theta" not in raw:
            return None
        params = {"rope_type": "default", "rope_theta": raw["rope_theta"]}
    if set(params) != {"rope_type", "rope_theta"} or params["rope_type"] != "default":
        return None
    return {"rope_type": "default", "rope_theta": float(params["rope_theta"])}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# What each field read here must hold (transformers' config classes check the same on their path).
KINDS: dict[str, tuple[str, Any]] = {
    "model_type": ("a string", lambda v: isinstance(v, str)),
    **{
        key: ("a positive integer", lambda v: _is_int(v) and v > 0)
        for key in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        )
    },
    "rms_norm_eps": ("a positive number", lambda v: (_is_int(v) or isinstance(v, float)) and v > 0),
    "tie_word_embeddings": ("true or false", lambda v: isinstance(v, bool)),
    "eos_token_id": (
        "a token id, a list of them or null",
        lambda v: v is None or _is_int(v) or (isinstance(v, list) and all(_is_int(x) for x in v)),
    ),
    "head_dim": ("a positive integer or null", lambda v: v is None or (_is_int(v) and v > 0)),
}


def fast_config(raw: dict[str, Any]) -> ModelConfig | None:
    """``raw`` (a parsed config.json) as a :class:`ModelConfig`, or None where transformers must
    interpret it. ValueError names a field that holds the wrong kind of value."""
    rope = plain_rope(raw)
    if rope is None or any(key not in raw for key in REQUIRED) or raw.get("sliding_window"):
        return None
    for key, (what, ok) in KINDS.items():
        if not ok(raw.get(key)):
            raise ValueError(f"{key} must be {what}, got {raw.get(key)!r}")
    return ModelConfig(
        **{key: raw[key] for key in REQUIRED}, rope_parameters=rope, head_dim=raw.get("head_dim")
    )


def read_config(directory: Path, raw: dict[str, Any]) -> ModelShape:
    """The config of the model in ``directory`` whose config.json parsed to ``raw``."""
    config = fast_config(raw)
    if config is not None:
        return config
    from transformers import AutoConfig

    loaded: ModelShape = AutoConfig.from_pretrained(directory)
    return loaded
