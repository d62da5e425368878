"""The model's architecture as the engine reads it, from config.json, fast.

transformers' own config classes cost about a second to import on the reference machine (the Llama
config module pulls in torch.distributed), a third of the cached start-up. A config.json that states
every field the engine reads, with plain RoPE and no sliding window, is read here into a
:class:`ModelConfig` with those values as written; anything that needs transformers to interpret it
(RoPE scaling, defaults for missing fields, sliding windows) goes through ``AutoConfig`` as before.
The engine reads configs by attribute, so either kind works everywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, Protocol, cast

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

# The model types whose every field the engine reads is in ModelConfig (the others have options
# of their own, ``engine/model/arch.py``, that transformers' config classes interpret).
FAST_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


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
    # each layer's "sliding_attention" or "full_attention" (None: every layer slides when there
    # is a window; a GGUF's sliding_window_pattern)
    layer_types: tuple[str, ...] | None = None


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
    if raw.get("model_type") not in FAST_MODEL_TYPES:
        return None
    for key, (what, ok) in KINDS.items():
        if not ok(raw.get(key)):
            raise ValueError(f"{key} must be {what}, got {raw.get(key)!r}")
    return ModelConfig(
        **{key: raw[key] for key in REQUIRED}, rope_parameters=rope, head_dim=raw.get("head_dim")
    )


def _layer_types(config: Any, n: int) -> list[str]:
    """Each layer's attention kind, ``"sliding_attention"`` or ``"full_attention"``: the config's
    ``layer_types`` (transformers derives them for Gemma 2/3, Qwen2/3, SmolLM3, Ministral), else
    the older spellings: Gemma 2's alternation (even layers slide), ``sliding_window_pattern``
    (every pattern-th layer is full: Gemma 3), Qwen2's ``use_sliding_window`` with the layers from
    ``max_window_layers`` on sliding; otherwise every layer slides (Mistral, Phi-3)."""
    types = getattr(config, "layer_types", None)
    if types is not None:
        if len(types) != n:
            raise ValueError(f"layer_types has {len(types)} entries for {n} layers")
        return list(types)
    slide, full = "sliding_attention", "full_attention"
    pattern = getattr(config, "sliding_window_pattern", None)
    if pattern is None and getattr(config, "model_type", None) == "gemma2":
        pattern = 2
    if pattern:
        return [slide if (i + 1) % pattern else full for i in range(n)]
    if getattr(config, "use_sliding_window", None) is False:
        return [full] * n
    first = getattr(config, "max_window_layers", None)
    if getattr(config, "use_sliding_window", None) and first is not None:
        return [slide if i >= first else full for i in range(n)]
    return [slide] * n


def layer_windows(config: Any) -> list[int]:
    """Each layer's sliding window in tokens (the query at position p sees keys p - window < j <=
    p), 0 for a layer of full attention; all 0 for a config without ``sliding_window``."""
    n = config.num_hidden_layers
    window = getattr(config, "sliding_window", None) or 0
    if window <= 0:
        return [0] * n
    types = _layer_types(config, n)
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown:
        raise ValueError(f"unsupported layer type {sorted(unknown)[0]!r} in layer_types")
    return [int(window) if t == "sliding_attention" else 0 for t in types]


def read_config(directory: Path, raw: dict[str, Any]) -> ModelShape:
    """The config of the model in ``directory`` whose config.json parsed to ``raw``."""
    config = fast_config(raw)
    if config is not None:
        return config
    from transformers import AutoConfig

    loaded: ModelShape = AutoConfig.from_pretrained(directory)
    return loaded


def config_identity(config: ModelShape) -> dict[str, Any]:
    """Every field of ``config`` that could shape the model's KV (layers, heads, head size,
    RoPE, windows...), JSON-able: a :class:`ModelConfig`'s fields, or a transformers config's
    dict without its bookkeeping (paths, versions)."""
    fields = asdict(config) if is_dataclass(config) else dict(cast(Any, config).to_dict())
    return {
        k: v
        for k, v in fields.items()
        if not k.startswith("_") and k not in ("transformers_version", "name_or_path")
    }
