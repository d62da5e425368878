"""What each architecture changes in the Llama forward (``engine/model/llama.py``), read from its
config: one :class:`Arch` of options, and the rotary tables of its layers.

* Llama 3.x, Mistral, Ministral, Qwen2/2.5: the plain path (scaled RoPE, QKV bias and sliding
  windows are options every path has).
* Qwen3: per-head RMSNorm of q and k before RoPE (found in the weights: ``q_norm``/``k_norm``).
* Gemma 2 and Gemma 3 text: RMSNorm scaling by ``1 + w`` (the 1 is added to the weights at load),
  GeGLU with tanh-approximated GELU, the embeddings scaled by ``sqrt(hidden)``, attention scaled by
  ``query_pre_attn_scalar ** -0.5``, norms after attention and after the MLP as well as before
  them (found in the weights), attention and final logit soft-capping (Gemma 2), and one RoPE
  table per layer type (Gemma 3: ``rope_parameters`` per layer type, the local base for sliding
  layers).
* Phi-3 / Phi-4-mini: QKV and gate+up fused in the checkpoint already (``fused_layout`` takes
  them as they are), partial rotary embeddings, LongRoPE.
* SmolLM3: no RoPE on the layers ``no_rope_layers`` marks 0.

Each layer's sliding window comes from ``model_config.layer_windows``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from chatpage.engine.model.model_config import layer_windows

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "ministral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "smollm3",
)

# what config.hidden_act / hidden_activation may name, as the MLP runs it
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}

GEMMA = ("gemma2", "gemma3_text")


@dataclass(frozen=True)
class Arch:
    """The per-architecture options of the forward."""

    scale: float  # of the attention scores
    windows: tuple[int, ...]  # each layer's sliding window, 0: full attention
    rope: tuple[str | None, ...]  # each layer's rotary table (a key of rope_tables), None: no RoPE
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): Gemma's 1
    activation: str = "silu"  # of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0  # the embeddings are multiplied by it (Gemma: sqrt(hidden))
    attn_softcap: float = 0.0  # scores -> tanh(scores / c) * c (0: none)
    final_softcap: float = 0.0  # the same on the logits

    @property
    def plain(self) -> bool:
        """Whether the layers are Llama's (the native decode loop's) apart from their windows."""
        return (
            self.activation == "silu"
            and self.attn_softcap == 0.0
            and all(r is not None for r in self.rope)
            and len(set(self.rope)) == 1
        )


def head_dim_of(config: Any) -> int:
    """The config's ``head_dim``, or hidden size over heads where it has none."""
    dim: int = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return dim


def _per_layer_type(config: Any) -> bool:
    """Whether ``rope_parameters`` holds one set per layer type (Gemma 3)."""
    params = getattr(config, "rope_parameters", None) or {}
    return bool(params) and all(isinstance(v, dict) for v in params.values())


def arch_of(config: Any) -> Arch:
    """The options of ``config``'s architecture (ValueError for an activation it cannot run)."""
    model_type = getattr(config, "model_type", "llama")
    n = config.num_hidden_layers
    act_name = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act_name not in ACTIVATIONS:
        raise ValueError(
            f"unsupported activation {act_name!r} (supported: {', '.join(ACTIVATIONS)})"
        )
    if _per_layer_type(config):
        rope: list[str | None] = list(config.layer_types)
    else:
        rope = ["default"] * n
    no_rope = getattr(config, "no_rope_layers", None)
    if no_rope is not None:
        rope = [key if use else None for key, use in zip(rope, no_rope, strict=True)]
    scalar = getattr(config, "query_pre_attn_scalar", None)
    gemma = model_type in GEMMA
    return Arch(
        scale=(scalar if scalar else head_dim_of(config)) ** -0.5,
        windows=tuple(layer_windows(config)),
        rope=tuple(rope),
        norm_offset=1.0 if gemma else 0.0,
        activation=ACTIVATIONS[act_name],
        embed_scale=math.sqrt(config.hidden_size) if gemma else 1.0,
        attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        final_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0),
    )


def _rope_parameters(config: Any, layer_type: str | None) -> dict[str, Any]:
    params = getattr(config, "rope_parameters", None) or {}
    return params[layer_type] if layer_type is not None else params


def rope_inv_freq(config: Any, layer_type: str | None = None) -> tuple[Tensor, float]:
    """Inverse frequencies and attention scaling from ``config.rope_parameters`` (those of
    ``layer_type`` where the config has a set per layer type); a partial rotary factor gives
    frequencies for that fraction of the head dimension only."""
    params = _rope_parameters(config, layer_type)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        partial = params.get("partial_rotary_factor") or getattr(
            config, "partial_rotary_factor", None
        )
        dim = int(head_dim_of(config) * (partial or 1.0))
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # scaled RoPE only: ~0.7 s

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r} in the model's rope_parameters")
    return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), layer_type=layer_type)


def rope_table(config: Any, positions: int, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
    """The fp32 cos and sin tables ``[positions, rotary dim]`` (rotate-half layout). LongRoPE's
    long factors rotate the positions from ``original_max_position_embeddings`` on, its short
    factors the ones before (transformers switches every position to the long factors once a
    sequence passes that length; a paged cache keeps the keys it already rotated)."""
    inv_freq, scaling = rope_inv_freq(config, layer_type)
    pos = torch.arange(positions, dtype=torch.float)
    freqs = torch.outer(pos, inv_freq)
    params = _rope_parameters(config, layer_type)
    if params.get("rope_type") == "longrope":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        orig = (
            params.get("original_max_position_embeddings")
            or config.original_max_position_embeddings
        )
        long_inv, _ = ROPE_INIT_FUNCTIONS["longrope"](
            config, torch.device("cpu"), seq_len=orig + 1, layer_type=layer_type
        )
        freqs[orig:] = torch.outer(pos[orig:], long_inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def rope_tables(config: Any, arch: Arch, positions: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Every rotary table ``arch``'s layers use, by key."""
    keys = sorted({r for r in arch.rope if r is not None})
    return {k: rope_table(config, positions, None if k == "default" else k) for k in keys}
