"""Llama-family forward pass over the paged KV cache (Llama, Mistral, Qwen2, SmolLM).

Weights come from the HF checkpoint; the forward is ours: embeddings, RMSNorm, RoPE from the
config's rope parameters, fused QKV (with Qwen2's bias), GQA paged attention, fused SwiGLU MLP, and
the lm_head (tied or not) applied only to the rows that need logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from chatpage.engine import attention

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

# Up to this many rows, the CPU matmuls run as W @ x.T (one row padded to two): MKL's paths for
# x @ W.T with 1-3 rows (a GEMV, or a slow small-M GEMM) read the weights at about half the speed.
# Measured on the default model, 1 thread: the step's matmuls at 1 row 45 -> 29 ms, 2 rows
# 79 -> 28 ms, 4 rows 63 -> 46 ms; from about 8 rows on, x @ W.T is as fast or faster.
SMALL_BATCH_ROWS = 4


@dataclass
class AttentionMetadata:
    """Per-step tensors every layer's attention needs (built once per step by the runner)."""

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor  # [(Hq + 2 Hkv) * D, H]
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor


def rope_inv_freq(config) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling from ``config.rope_parameters``."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rope_type == "default":
        base = params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r} in the model's rope_parameters")
    return ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))


class LlamaModel:
    """The decoder stack with weights as plain tensors; ``forward`` runs one engine step."""

    def __init__(self, config, state: dict[str, torch.Tensor], dtype: torch.dtype, device: str):
        self.config = config
        self.num_layers = config.num_hidden_layers
        self.hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim**-0.5
        self.dtype = dtype
        self.device = torch.device(device)
        self._small_rows = SMALL_BATCH_ROWS if self.device.type == "cpu" else 0

        def w(name: str) -> torch.Tensor:
            return state.pop(name).to(device=self.device, dtype=dtype).contiguous()

        self.embed = w("model.embed_tokens.weight")
        self.layers: list[LayerWeights] = []
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([w(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
            bias = None
            if p + "self_attn.q_proj.bias" in state:
                bias = torch.cat([w(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
            gate_up = torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")])
            self.layers.append(
                LayerWeights(
                    input_norm=w(p + "input_layernorm.weight"),
                    qkv=qkv,
                    qkv_bias=bias,
                    o=w(p + "self_attn.o_proj.weight"),
                    post_norm=w(p + "post_attention_layernorm.weight"),
                    gate_up=gate_up,
                    down=w(p + "mlp.down_proj.weight"),
                )
            )
        self.norm = w("model.norm.weight")
        self.lm_head = w("lm_head.weight") if "lm_head.weight" in state else self.embed

        inv_freq, scaling = rope_inv_freq(config)
        self.max_positions = config.max_position_embeddings
        pos = torch.arange(self.max_positions, dtype=torch.float)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * scaling).to(self.device, dtype)
        self.sin = (emb.sin() * scaling).to(self.device, dtype)

    @property
    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm, self.cos, self.sin]
        if self.lm_head is not self.embed:
            tensors.append(self.lm_head)
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _linear(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
        """``F.linear(x, w, bias)``, through W @ x.T for the few rows of a small batch on CPU."""
        n = x.shape[0]
        if not 0 < n <= self._small_rows:
            return F.linear(x, w, bias)
        rows = torch.cat([x, x]) if n == 1 else x
        y = torch.mm(w, rows.t())[:, :n].t()
        if bias is not None:
            y = y + bias
        return y.contiguous()

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Run the flat batch ``input_ids`` [T]; return logits [len(logit_rows), vocab]."""
        T = input_ids.shape[0]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        q_size, kv_size = hq * d, hkv * d
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        h = F.embedding(input_ids, self.embed)
        attn_out = torch.empty(T, hq, d, dtype=self.dtype, device=self.device)
        for i, layer in enumerate(self.layers):
            x = self._rms_norm(h, layer.input_norm)
            qkv = self._linear(x, layer.qkv, layer.qkv_bias)
            # RoPE on the query and key heads in one pass; q and k are views of its result
            qk = self._rotate(qkv[:, : q_size + kv_size].view(T, hq + hkv, d), cos, sin)
            q, k = qk[:, :hq], qk[:, hq:]
            v = qkv[:, q_size + kv_size :].view(T, hkv, d)
            attention.write_kv(k, v, k_caches[i], v_caches[i], meta.slot_mapping)
            attention.paged_attention(
                attn_out, q, k_caches[i], v_caches[i], meta.block_tables, meta.seq_lens,
                meta.query_start_loc, self.scale,
            )
            h = h + self._linear(attn_out.view(T, q_size), layer.o)
            x = self._rms_norm(h, layer.post_norm)
            gate, up = self._linear(x, layer.gate_up).chunk(2, dim=-1)
            h = h + self._linear(F.silu(gate) * up, layer.down)
        last = self._rms_norm(h[logit_rows], self.norm)
        return self._linear(last, self.lm_head).float()
