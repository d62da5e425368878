"""Llama-family forward pass over the paged KV cache (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3,
SmolLM2/3).

Weights come from the HF checkpoint, stored in a weight format (``engine/model/weights.py``); the forward
is ours: embeddings, RMSNorm, RoPE from the config's rope parameters, fused QKV (with Qwen2's bias),
GQA paged attention (each layer's sliding window), fused SwiGLU MLP, and the lm_head (tied or not)
applied only to the rows that need logits. A layer is its four matmuls, the two attention ops and
three fused ops (``engine/model/fused.py``: residual add + RMSNorm twice, RoPE + QKV split, SwiGLU), into
buffers allocated once per step; the residual add of each sublayer happens inside the next norm.
What the other architectures change is a set of options of the same layer loop
(``engine/model/arch.py``): q/k norms, norms after attention and after the MLP, GeGLU, partial or
no RoPE, soft-capping, scaled embeddings; a model with any of them runs the Python loop.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

import torch
from torch import Tensor

from chatpage.engine.config import check_format
from chatpage.engine.core.kv_groups import kv_groups
from chatpage.engine.model import attention
from chatpage.engine.model import fused as fused_ops
from chatpage.engine.model.arch import SUPPORTED_MODEL_TYPES, arch_of, head_dim_of, rope_tables
from chatpage.engine.model.model_config import ModelShape
from chatpage.engine.model.weights import (
    Embedding,
    Linear,
    fuse_state,
    make_linear,
    matmul_dtype,
    pack_state,
    state_format,
    step_bytes,
)

__all__ = ["SUPPORTED_MODEL_TYPES", "AttentionMetadata", "LayerWeights", "LlamaModel", "Step"]


@dataclass
class AttentionMetadata:
    """Per-step tensors every layer's attention needs (built once per step by the runner)."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    # KV groups 1, 2, ... (``engine/core/kv_groups.py``): their slot mappings and block tables
    group_slots: tuple[torch.Tensor, ...] = ()
    group_tables: tuple[torch.Tensor, ...] = ()

    def to(self, device: torch.device) -> AttentionMetadata:
        """These tensors on ``device`` (copied without blocking the host)."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, non_blocking=True)

        return AttentionMetadata(
            move(self.slot_mapping),
            move(self.block_tables),
            move(self.seq_lens),
            move(self.query_start_loc),
            tuple(map(move, self.group_slots)),
            tuple(map(move, self.group_tables)),
        )

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot mapping and block tables of KV group ``g`` (group 0's for every group when
        the step gave no others: a scratch step over one table)."""
        if g == 0 or not self.group_tables:
            return self.slot_mapping, self.block_tables
        return self.group_slots[g - 1], self.group_tables[g - 1]


@dataclass
class Step:
    """What a step's layer loop (native or Python) works on: the residual stream ``h`` (updated
    in place), the positions, the attention metadata, the caches, and the scratch tensors
    allocated once per step."""

    h: Tensor
    positions: Tensor
    meta: AttentionMetadata
    k_caches: list[Tensor]
    v_caches: list[Tensor]
    x: Tensor
    q: Tensor
    k: Tensor
    v: Tensor
    act: Tensor
    attn_out: Tensor


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # [T, H] -> [T, (Hq + 2 Hkv) * D], Qwen2's bias included
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # [T, H] -> [T, 2 I]
    down: Linear
    q_norm: Tensor | None = None  # per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3)
    k_norm: Tensor | None = None
    attn_out_norm: Tensor | None = None  # RMSNorm of the attention output (Gemma 2/3)
    mlp_out_norm: Tensor | None = None  # RMSNorm of the MLP output (Gemma 2/3)

    @property
    def plain(self) -> bool:
        """Without any of the optional norms (Llama's layer)."""
        return all(
            n is None for n in (self.q_norm, self.k_norm, self.attn_out_norm, self.mlp_out_norm)
        )


class NativeLayers:
    """``torch.ops.chatpage.decode_layers`` with one model's weights bound: all its decoder layers
    for a step of at most ``rows`` rows in one native call: the GEMVs' rows (the decode steps),
    or every step where each matmul's GEMM starts right after its GEMV (``Linear.gemm``), from
    ``gemm_rows`` rows on, or where every matmul is a q8 pack (``packed``: one kernel for any
    rows)."""

    def __init__(self, model: LlamaModel, linears: list[Linear]) -> None:
        self.model = model
        self.norms = [n for layer in model.layers for n in (layer.input_norm, layer.post_norm)]
        gemvs = [f.gemv for f in linears if f.gemv is not None]  # (all have one: see the caller)
        lib = torch.ops.chatpage
        # q8 packs (every row count): 2 parts, the pack and int8's scales or int4's levels
        self.packed = {g.op for g in gemvs} <= self.pack_kernels()
        # int4 with levels of its own takes 4 parts; where only some matrices have them, the
        # others' 4th is an empty tensor (decode_layers: q - 8)
        self.parts = 2 if self.packed else max(len(g.parts) for g in gemvs)
        none = (torch.empty(0, dtype=torch.int8),)
        self.weights = [t for g in gemvs for t in g.parts + none * (self.parts - len(g.parts))]
        self.biases = [g.bias for g in gemvs]
        self.rows = min(g.rows for g in gemvs)
        gemms = [f.gemm for f in linears if f.gemm is not None]
        starts = {g.rows for g in gemms}
        self.gemm_rows, self.q8 = 0, False
        # every step can run natively (not with q8 packs: one kernel up to `q8_pack_rows`)
        if not self.packed and len(gemms) == len(linears) and len(starts) == 1:
            self.gemm_rows, self.rows = starts.pop(), sys.maxsize
            self.q8 = {g.op for g in gemms} <= {lib.gemm_q8_int8, lib.gemm_q8_int4}
        self.windows = model.windows

    @staticmethod
    def pack_kernels() -> set[object]:
        """The kernels of q8 packs (``weights.q8_packs``), which decode_layers takes as such."""
        lib = torch.ops.chatpage
        return {lib.gemm_q8_int8_packed, lib.gemm_q8_int4_packed}

    def __call__(self, s: Step) -> Tensor:
        m, meta = self.model, s.meta
        out: Tensor = torch.ops.chatpage.decode_layers(
            s.h,
            s.positions,
            m.cos,
            m.sin,
            self.norms,
            self.weights,
            self.biases,
            self.parts,
            s.k_caches,
            s.v_caches,
            meta.slot_mapping,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            m.eps,
            m.scale,
            self.windows,
            s.x,
            s.q,
            s.k,
            s.v,
            s.act,
            s.attn_out,
            self.gemm_rows,
            self.q8,
            self.packed,
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
        positions: int | None = None,
    ) -> None:
        """``state``: HF-named fp32 tensors (fused and packed here, consumed; a checkpoint
        streamed onto the device, ``engine/load/stream.py``) or a state already packed by
        :func:`chatpage.engine.model.weights.pack_state` (a cached start) in ``weights``. ``half``
        (a GPU's bf16 or fp16) is the dtype of the matmul inputs and dense weights when given;
        the residual stream, norms and RoPE keep ``dtype``. ``positions``: how many positions
        the rotary tables cover (None: the model's context; see `set_positions`)."""
        self.config = config
        self.num_layers = config.num_hidden_layers
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = head_dim_of(config)
        self.eps = config.rms_norm_eps
        self.arch = arch_of(config)
        self.scale = self.arch.scale
        self.windows = list(self.arch.windows)  # each layer's sliding window, 0: full attention
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

        def norm(name: str) -> torch.Tensor:
            """A norm's weight as applied (Gemma's 1 + w)."""
            w = packed[name].to(self.device, torch.float32) + self.arch.norm_offset
            return w.to(dtype).contiguous()

        def optional(name: str) -> torch.Tensor | None:
            return norm(name) if name in packed else None

        self.embed = Embedding(packed, self.device, dtype)
        self.vocab_size = self.embed.num_embeddings
        self.layers = [
            LayerWeights(
                input_norm=norm(f"layers.{i}.input_norm"),
                qkv=make_linear(packed, f"layers.{i}.qkv", self.device, half),
                o=make_linear(packed, f"layers.{i}.o", self.device, half),
                post_norm=norm(f"layers.{i}.post_norm"),
                gate_up=make_linear(packed, f"layers.{i}.gate_up", self.device, half),
                down=make_linear(packed, f"layers.{i}.down", self.device, half),
                q_norm=optional(f"layers.{i}.q_norm"),
                k_norm=optional(f"layers.{i}.k_norm"),
                attn_out_norm=optional(f"layers.{i}.attn_out_norm"),
                mlp_out_norm=optional(f"layers.{i}.mlp_out_norm"),
            )
            for i in range(self.num_layers)
        ]
        self.norm = norm("norm")
        tied = not any(k.startswith("lm_head.") for k in packed)
        self.lm_head = make_linear(packed, "embed" if tied else "lm_head", self.device, half)
        packed.clear()

        self.set_positions(positions or config.max_position_embeddings)
        self.intermediate = self.layers[0].down.in_features
        self.fused = fused_ops.for_model(self.device, dtype)
        self.native_layers = self._native_layers()

    def set_positions(self, positions: int) -> None:
        """Build the rotary tables for positions ``0 .. positions - 1`` (at most the model's
        context): the positions a sequence can reach, which the engine knows once its KV pool
        is sized (a file's context length alone may ask for tables of many GiB)."""
        self.max_positions = min(positions, self.config.max_position_embeddings)
        tables = {
            key: (cos.to(self.device, self.dtype), sin.to(self.device, self.dtype))
            for key, (cos, sin) in rope_tables(self.config, self.arch, self.max_positions).items()
        }
        # each layer's rotary tables (None: a layer without RoPE)
        self.rope = [None if key is None else tables[key] for key in self.arch.rope]
        # the native loop's (one table: its architectures rotate every layer alike)
        self.cos: Tensor | None = None
        self.sin: Tensor | None = None
        if tables:
            self.cos, self.sin = next(iter(tables.values()))

    def _native_layers(self) -> NativeLayers | None:
        """The native layer loop, unless a layer matmul lacks a native GEMV (they exist on the CPU
        only), the fused ops are not native (they are for an fp32 residual stream), or the
        architecture's layers are not Llama's (:attr:`Arch.plain`, :attr:`LayerWeights.plain`,
        rotary embeddings over the whole head)."""
        linears = [
            f for layer in self.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        plain = (
            self.arch.plain
            and all(layer.plain for layer in self.layers)
            and self.cos is not None
            and self.cos.shape[-1] == self.head_dim
        )
        if not plain or not self.fused.native or any(f.gemv is None for f in linears):
            return None
        if self.kv_groups.num_groups > 1:
            return None  # (the native loop takes one block table for all layers)
        packs = NativeLayers.pack_kernels()
        if len({f.gemv is not None and f.gemv.op in packs for f in linears}) > 1:
            return None  # (some matrices are q8 packs, others not: one call takes one kind)
        return NativeLayers(self, linears)

    @property
    def exact_rows(self) -> int:
        """The most rows a step may have for every row's logits to be the bits that row gets
        in a step of its own (row invariance, which exact speculative decoding rests on:
        ``engine/core/speculate.py``): as many as one kernel computes each matmul of, where the
        native layer loop runs (its attention computes a sequence of few rows row by row,
        csrc/cpu/attention.cpp); 1 elsewhere (the reference's or a GPU's kernels, which
        promise nothing of the kind)."""
        if self.native_layers is None or self.arch.attn_softcap:
            return 1
        linears = [
            f for layer in self.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        lib = torch.ops.chatpage
        # the kernels that compute a row alike in every call of up to their rows (checked in
        # tests/engine/test_speculate.py); fp32's and bf16's GEMVs tile rows unevenly
        alike = {lib.gemv_int4, lib.gemv_int8, *NativeLayers.pack_kernels()}
        return min(
            f.gemv.rows if f.gemv is not None and f.gemv.op in alike else 1
            for f in [*linears, self.lm_head]
        )

    def _normed(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm of ``x`` over its last dimension (a sublayer's output, or q/k heads)."""
        out = torch.empty(x.shape, dtype=self.dtype, device=x.device)
        fused_ops.add_rms_norm(x, None, weight, self.eps, out)
        return out

    def _qkv(
        self,
        layer: LayerWeights,
        rope: tuple[Tensor, Tensor] | None,
        qkv: Tensor,
        positions: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
    ) -> None:
        """``qkv`` split into ``q``, ``k``, ``v``, q and k normed per head (when the layer has
        q/k norms) and rotated by ``rope`` (over its part of each head; not at all without it)."""
        if layer.q_norm is None and rope is not None and rope[0].shape[-1] == self.head_dim:
            self.fused.rope_qkv(qkv, positions, rope[0], rope[1], q, k, v)
            return
        hq, hkv = q.shape[1], k.shape[1]
        heads = qkv.view(qkv.shape[0], hq + 2 * hkv, self.head_dim).to(q.dtype)
        qk = heads[:, : hq + hkv]
        if layer.q_norm is not None and layer.k_norm is not None:
            qk = torch.cat(
                [self._normed(qk[:, :hq], layer.q_norm), self._normed(qk[:, hq:], layer.k_norm)],
                dim=1,
            )
        if rope is not None:
            cos, sin = rope[0][positions].unsqueeze(1), rope[1][positions].unsqueeze(1)
            qk = fused_ops.apply_rope(qk, cos, sin)
        q.copy_(qk[:, :hq])
        k.copy_(qk[:, hq:])
        v.copy_(heads[:, hq + hkv :])

    def _python_layers(self, s: Step) -> Tensor | None:
        """Every decoder layer on the residual stream ``s.h`` (updated in place), through the
        scratch tensors; returns the last layer's MLP output (the final norm adds it). The
        specification of ``decode_layers`` (csrc/cpu/decode.cpp) for Llama's layers; the
        options of the other architectures (:mod:`chatpage.engine.model.arch`) take their
        branches here."""
        fused, eps, arch = self.fused, self.eps, self.arch
        h, positions, meta, k_caches, v_caches = s.h, s.positions, s.meta, s.k_caches, s.v_caches
        x, q, k, v, act, attn_out = s.x, s.q, s.k, s.v, s.act, s.attn_out
        act_mul = fused.silu_mul if arch.activation == "silu" else fused_ops.gelu_tanh_mul
        attn_flat = attn_out.view(attn_out.shape[0], -1)
        delta: Tensor | None = None  # the previous layer's MLP output, added by the next norm
        for i, layer in enumerate(self.layers):
            slots, tables = meta.group(self.kv_groups.layer_group[i])
            fused.add_rms_norm(h, delta, layer.input_norm, eps, x)
            self._qkv(layer, self.rope[i], layer.qkv(x), positions, q, k, v)
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
                arch.attn_softcap,
            )
            o = layer.o(attn_flat.to(self.mm_dtype))
            if layer.attn_out_norm is not None:
                o = self._normed(o, layer.attn_out_norm)
            fused.add_rms_norm(h, o, layer.post_norm, eps, x)
            act_mul(layer.gate_up(x), act)
            delta = layer.down(act)
            if layer.mlp_out_norm is not None:
                delta = self._normed(delta, layer.mlp_out_norm)
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
        if self.arch.embed_scale != 1.0:
            h.mul_(torch.tensor(self.arch.embed_scale, dtype=h.dtype))
        x = torch.empty(T, self.hidden, dtype=self.mm_dtype, device=dev)
        step = Step(
            h,
            positions,
            meta,
            k_caches,
            v_caches,
            x,
            q=torch.empty(T, hq, d, dtype=self.dtype, device=dev),
            k=torch.empty(T, hkv, d, dtype=self.dtype, device=dev),
            v=torch.empty(T, hkv, d, dtype=self.dtype, device=dev),
            act=torch.empty(T, self.intermediate, dtype=self.mm_dtype, device=dev),
            attn_out=torch.empty(T, hq, d, dtype=self.dtype, device=dev),
        )
        native = self.native_layers
        layers = native if native is not None and T <= native.rows else self._python_layers
        delta = layers(step)
        self.fused.add_rms_norm(h, delta, self.norm, self.eps, x)
        logits = self.lm_head(x[logit_rows]).float()
        cap = self.arch.final_softcap
        return torch.tanh(logits / cap) * cap if cap else logits
