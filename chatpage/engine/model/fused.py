"""The decode step's small per-layer ops: residual add + RMSNorm, RoPE + QKV split, SwiGLU (and
GeGLU, reference only: Gemma's MLP).

Each writes into tensors the caller allocated once per step. The functions here are the torch
reference and the specification of the fused kernels in ``csrc/cpu/fused.cpp`` and
``csrc/cuda/fused.cu`` (``torch.ops.chatpage.*``); :func:`for_model` picks the kernels when they
are loaded for the model's device (CPU or CUDA) and its residual stream is fp32, and the
reference everywhere else.
Measured on the default model at batch 1, 1 thread: see ``chatpage bench single``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from chatpage.engine.model import ops


def add_rms_norm(
    hidden: torch.Tensor,
    delta: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
) -> None:
    """``hidden += delta`` (when given, in place), then ``out = weight * rmsnorm(hidden)`` in
    ``out``'s dtype."""
    if delta is not None:
        hidden.add_(delta)
    xf = hidden.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out.copy_(weight * xf.to(hidden.dtype))


def rope_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Split ``qkv`` [T, (Hq + 2 Hkv) D] into ``q`` [T, Hq, D], ``k``, ``v`` [T, Hkv, D] (their
    dtype), rotating q and k by the rotary tables at ``positions`` (rotate-half convention)."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    heads = qkv.view(t, hq + 2 * hkv, d).to(q.dtype)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    roped = apply_rope(heads[:, : hq + hkv], c, s)
    q.copy_(roped[:, :hq])
    k.copy_(roped[:, hq:])
    v.copy_(heads[:, hq + hkv :])


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` [..., D] rotated by ``cos``/``sin`` [..., R] (broadcast; rotate-half convention) over
    its first R dimensions; the rest pass through (partial rotary embeddings)."""
    r = cos.shape[-1]
    part, half = x[..., :r], r // 2
    rotated = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
    roped = part * cos + rotated * sin
    return roped if r == x.shape[-1] else torch.cat([roped, x[..., r:]], dim=-1)


def gelu_tanh_mul(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """``out = gelu_tanh(gate) * up`` for ``gate_up`` = [gate | up] (Gemma's GeGLU)."""
    gate, up = gate_up.chunk(2, dim=-1)
    out.copy_(F.gelu(gate, approximate="tanh") * up)


def silu_mul(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """``out = silu(gate) * up`` for ``gate_up`` = [gate | up] along the last dimension."""
    gate, up = gate_up.chunk(2, dim=-1)
    out.copy_(F.silu(gate) * up)


@dataclass(frozen=True)
class FusedOps:
    """The three ops one model runs with (native kernels or the reference)."""

    native: bool
    add_rms_norm: Callable[..., None]
    rope_qkv: Callable[..., None]
    silu_mul: Callable[..., None]


REFERENCE = FusedOps(False, add_rms_norm, rope_qkv, silu_mul)


def for_model(device: torch.device, dtype: torch.dtype) -> FusedOps:
    """The native kernels for an fp32 model on the CPU or CUDA when they are loaded there, else
    the reference."""
    if device.type not in ("cpu", "cuda") or dtype != torch.float32 or not ops.available(device):
        return REFERENCE
    lib = torch.ops.chatpage
    return FusedOps(True, lib.add_rms_norm, lib.rope_qkv, lib.silu_mul)
