"""Checks of the fused decode-step ops against their torch reference (chatpage/engine/model/fused.py),
shared by the CPU tests (tests/kernels/test_fused.py) and the CUDA tests (tests/gpu/test_cuda_fused.py):
each runs the reference and ``native`` on the same inputs placed on ``device``."""

from __future__ import annotations

import torch

from chatpage.engine.model import fused

BF16, F32 = torch.bfloat16, torch.float32


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    tol = 1e-2 if torch.float32 not in (a.dtype, b.dtype) or BF16 in (a.dtype, b.dtype) else 1e-5
    torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=tol, atol=tol)


def check_add_rms_norm(
    native: fused.FusedOps,
    device: str,
    rows: int,
    delta_dtype: torch.dtype | None,
    out_dtype: torch.dtype,
) -> None:
    torch.manual_seed(0)
    n = 200  # not a multiple of 16 (CPU) or of the CTA's threads (CUDA): the tails run too
    hidden = torch.randn(rows, n, device=device)
    delta = None if delta_dtype is None else torch.randn(rows, n, device=device).to(delta_dtype)
    weight = torch.rand(n, device=device) + 0.5
    outs, hiddens = [], []
    for impl in (fused.REFERENCE, native):
        h, out = hidden.clone(), torch.empty(rows, n, dtype=out_dtype, device=device)
        impl.add_rms_norm(h, delta, weight, 1e-5, out)
        outs.append(out)
        hiddens.append(h)
    close(*hiddens)
    close(*outs)
    if delta is not None:
        close(hiddens[1], hidden + delta.float())


def check_rope_qkv(native: fused.FusedOps, device: str, rows: int, qkv_dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    hq, hkv, d, positions = 6, 2, 64, 300
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, device=device).to(qkv_dtype)
    pos = torch.randint(0, positions, (rows,), device=device)
    angles = torch.rand(positions, d, device=device)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    results = []
    for impl in (fused.REFERENCE, native):
        q, k, v = (torch.empty(rows, h, d, device=device) for h in (hq, hkv, hkv))
        impl.rope_qkv(qkv, pos, cos, sin, q, k, v)
        results.append((q, k, v))
    for a, b in zip(*results, strict=True):
        close(a, b)
    close(results[1][2].flatten(1), qkv[:, (hq + hkv) * d :])  # v is copied, not rotated


def check_silu_mul(native: fused.FusedOps, device: str, rows: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    width = 101  # twelve vectors of eight and a tail
    gate_up = torch.randn(rows, 2 * width, device=device) * 4
    gate_up[:, :2] = torch.tensor([-200.0, 200.0])  # exp(-gate) past fp32's range either way
    gate_up = gate_up.to(dtype)
    outs = []
    for impl in (fused.REFERENCE, native):
        out = torch.empty(rows, width, dtype=dtype, device=device)
        impl.silu_mul(gate_up, out)
        outs.append(out)
    close(*outs)
