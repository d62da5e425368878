"""Llama-family forward pass over the paged KV cache (Llama, Mistral, Qwen2, SmolLM).

Weights come from the HF checkpoint, stored in a weight format (``engine/weights.py``); the forward
is ours: embeddings, RMSNorm, RoPE from the config's rope parameters, fused QKV (with Qwen2's bias),
GQA paged attention, fused SwiGLU MLP, and the lm_head (tied or not) applied only to the rows that
need logits. A layer is its four matmuls, the two attention ops and three fused ops
(``engine/fused.py``: residual add + RMSNorm twice, RoPE + QKV split, SwiGLU), into buffers
allocated once per step; the residual add of each sublayer happens inside the next norm.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
from torch import Tensor

from chatpage.engine import attention
from chatpage.engine import fused as fused_ops
from chatpage.engine.config import check_format
from chatpage.engine.kv_groups import kv_groups
from chatpage.engine.model_config import ModelShape, layer_windows
from chatpage.engine.weights import (
    Embedding,
    Linear,
    fuse_state,
    make_linear,
    matmul_dtype,
    pack_state,
    state_format,
    step_bytes,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass
class AttentionMetadata:
    """Per-step tensors every layer's attention needs (built once per step by the runner)."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    # KV groups 1, 2, ... (``engine/kv_groups.py``): their slot mappings and block tables
    group_slots: tuple[torch.Tensor, ...] = ()
    group_tables: tuple[torch.Tensor, ...] = ()

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot mapping and block tables of KV group ``g`` (group 0's for every group when
        the step gave no others: a scratch step over one table)."""
        if g == 0 or not self.group_tables:
            return self.slot_mapping, self.block_tables
        return self.group_slots[g - 1], self.group_tables[g - 1]


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # [T, H] -> [T, (Hq + 2 Hkv) * D], Qwen2's bias included
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # [T, H] -> [T, 2 I]
    down: Linear


def rope_inv_freq(config: ModelShape) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling from ``config.rope_parameters``."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rope_type == "default":
        base = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # scaled RoPE only: ~0.7 s

    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r} in the model's rope_parameters")
    return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))


class NativeLayers:
    """``torch.ops.chatpage.decode_layers`` with one model's weights bound: all its decoder layers
    for a step of at most ``rows`` rows in one native call (the decode steps)."""

    def __init__(self, model: LlamaModel, linears: list[Linear]) -> None:
        self.model = model
        self.norms = [n for layer in model.layers for n in (layer.input_norm, layer.post_norm)]
        gemvs = [f.gemv for f in linears if f.gemv is not None]  # (all have one: see the caller)
        self.weights = [t for g in gemvs for t in g.parts]
        self.biases = [g.bias for g in gemvs]
        self.parts = len(gemvs[0].parts)
        self.rows = min(g.rows for g in gemvs)
        self.windows = model.windows

    def __call__(
        self,
        h: Tensor,
        positions: Tensor,
        meta: AttentionMetadata,
        k_caches: list[Tensor],
        v_caches: list[Tensor],
        x: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        act: Tensor,
        attn_out: Tensor,
    ) -> Tensor:
        m = self.model
        out: Tensor = torch.ops.chatpage.decode_layers(
            h,
            positions,
            m.cos,
            m.sin,
            self.norms,
            self.weights,
            self.biases,
            self.parts,
            k_caches,
            v_caches,
            meta.slot_mapping,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            m.eps,
            m.scale,
            self.windows,
            x,
            q,
            k,
            v,
            act,
            attn_out,
        )
        return out


class LlamaModel:
    """The decoder stack with weights as plain tensors; ``forward`` runs one engine step."""

    def __init__(
        self,
        config: ModelShape,
        state: MutableMapping[str, torch.Tensor],
        dtype: torch.dtype,
        device: str | torch.device,
        weights: str = "fp32",
        half: torch.dtype | None = None,
    ) -> None:
        """``state``: HF-named fp32 tensors (fused and packed here, consumed; a checkpoint
        streamed onto the device, ``engine/stream.py``) or a state already packed by
        :func:`chatpage.engine.weights.pack_state` (a cached start) in ``weights``. ``half``
        (a GPU's bf16 or fp16) is the dtype of the matmul inputs and dense weights when given;
        the residual stream, norms and RoPE keep ``dtype``."""
        self.config = config
        self.num_layers = config.num_hidden_layers
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.windows = layer_windows(config)  # each layer's sliding window, 0: full attention
        self.kv_groups = kv_groups(self.windows)  # which block table each layer reads
        self.dtype = dtype
        self.device = torch.device(device)
        self.weights = check_format(weights)
        self.mm_dtype = half or matmul_dtype(weights, dtype)
        found = state_format(state)
        if found is None:
            packed = pack_state(config, fuse_state(config, state), weights, dtype)
        elif found != weights:
            raise ValueError(f"the given state is packed as {found}, not {weights}")
        else:
            packed = dict(state)
            state.clear()  # (consumed, as the HF-named tensors are)
        self.weight_bytes = step_bytes(config, packed)

        def t(name: str) -> torch.Tensor:
            return packed[name].to(device=self.device, dtype=dtype).contiguous()

        self.embed = Embedding(packed, self.device, dtype)
        self.vocab_size = self.embed.num_embeddings
        self.layers = [
            LayerWeights(
                input_norm=t(f"layers.{i}.input_norm"),
                qkv=make_linear(packed, f"layers.{i}.qkv", self.device, half),
                o=make_linear(packed, f"layers.{i}.o", self.device, half),
                post_norm=t(f"layers.{i}.post_norm"),
                gate_up=make_linear(packed, f"layers.{i}.gate_up", self.device, half),
                down=make_linear(packed, f"layers.{i}.down", self.device, half),
            )
            for i in range(self.num_layers)
        ]
        self.norm = t("norm")
        tied = not any(k.startswith("lm_head.") for k in packed)
        self.lm_head = make_linear(packed, "embed" if tied else "lm_head", self.device, half)
        packed.clear()

        inv_freq, scaling = rope_inv_freq(config)
        self.max_positions = config.max_position_embeddings
        pos = torch.arange(self.max_positions, dtype=torch.float)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * scaling).to(self.device, dtype)
        self.sin = (emb.sin() * scaling).to(self.device, dtype)
        self.intermediate = self.layers[0].down.in_features
        self.fused = fused_ops.for_model(self.device, dtype)
        self.native_layers = self._native_layers()

    def _native_layers(self) -> NativeLayers | None:
        """The native layer loop, unless a layer matmul lacks a native GEMV (they exist on the CPU
        only) or the fused ops are not native (they are for an fp32 residual stream)."""
        linears = [
            f for layer in self.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        if not self.fused.native or any(f.gemv is None for f in linears):
            return None
        if self.kv_groups.num_groups > 1:
            return None  # (the native loop takes one block table for all layers)
        return NativeLayers(self, linears)

    def _python_layers(
        self,
        h: Tensor,
        positions: Tensor,
        meta: AttentionMetadata,
        k_caches: list[Tensor],
        v_caches: list[Tensor],
        x: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        act: Tensor,
        attn_out: Tensor,
    ) -> Tensor | None:
        """Every decoder layer on the residual stream ``h`` (updated in place), through the
        scratch tensors; returns the last layer's MLP output (the final norm adds it). The
        specification of ``decode_layers`` (csrc/cpu/decode.cpp)."""
        fused, eps = self.fused, self.eps
        attn_flat = attn_out.view(attn_out.shape[0], -1)
        delta: Tensor | None = None  # the previous layer's MLP output, added by the next norm
        for i, layer in enumerate(self.layers):
            slots, tables = meta.group(self.kv_groups.layer_group[i])
            fused.add_rms_norm(h, delta, layer.input_norm, eps, x)
            fused.rope_qkv(layer.qkv(x), positions, self.cos, self.sin, q, k, v)
            attention.write_kv(k, v, k_caches[i], v_caches[i], slots)
            attention.paged_attention(
                attn_out,
                q,
                k_caches[i],
                v_caches[i],
                tables,
                meta.seq_lens,
                meta.query_start_loc,
                self.scale,
                self.windows[i],
            )
            fused.add_rms_norm(h, layer.o(attn_flat.to(self.mm_dtype)), layer.post_norm, eps, x)
            fused.silu_mul(layer.gate_up(x), act)
            delta = layer.down(act)
        return delta

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Run the flat batch ``input_ids`` [T]; return logits [len(logit_rows), vocab]. A step of
        few rows runs its layers in one native call (:meth:`_native_layers`), others through
        :meth:`_python_layers`."""
        T = input_ids.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        dev = self.device
        h = self.embed(input_ids)  # the residual stream, updated in place
        x = torch.empty(T, self.hidden, dtype=self.mm_dtype, device=dev)
        q = torch.empty(T, hq, d, dtype=self.dtype, device=dev)
        k = torch.empty(T, hkv, d, dtype=self.dtype, device=dev)
        v = torch.empty(T, hkv, d, dtype=self.dtype, device=dev)
        act = torch.empty(T, self.intermediate, dtype=self.mm_dtype, device=dev)
        attn_out = torch.empty(T, hq, d, dtype=self.dtype, device=dev)
        native = self.native_layers
        layers = native if native is not None and T <= native.rows else self._python_layers
        delta = layers(h, positions, meta, k_caches, v_caches, x, q, k, v, act, attn_out)
        self.fused.add_rms_norm(h, delta, self.norm, self.eps, x)
        return self.lm_head(x[logit_rows]).float()
