"""The fused decode-step kernels (csrc/cpu/fused.cpp) match their torch reference
(chatpage/engine/fused.py) for every dtype pair the model uses, at batch 1 and for many rows."""

from __future__ import annotations

import pytest
import torch

from chatpage.engine import fused, ops

NATIVE = fused.for_model(torch.device("cpu"), torch.float32)
BF16, F32 = torch.bfloat16, torch.float32


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    tol = 1e-2 if BF16 in (a.dtype, b.dtype) else 1e-5
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


def test_the_model_gets_the_native_ops_only_where_they_apply():
    assert ops.available("cpu") and NATIVE.native
    assert not fused.for_model(torch.device("cpu"), BF16).native
    assert not fused.for_model(torch.device("meta"), F32).native


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("delta_dtype", [None, F32, BF16])
@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_add_rms_norm(rows, delta_dtype, out_dtype):
    torch.manual_seed(0)
    n = 200  # not a multiple of 16: the tail loop runs too
    hidden = torch.randn(rows, n)
    delta = None if delta_dtype is None else torch.randn(rows, n).to(delta_dtype)
    weight = torch.rand(n) + 0.5
    outs, hiddens = [], []
    for impl in (fused.REFERENCE, NATIVE):
        h, out = hidden.clone(), torch.empty(rows, n, dtype=out_dtype)
        impl.add_rms_norm(h, delta, weight, 1e-5, out)
        outs.append(out)
        hiddens.append(h)
    _close(*hiddens)
    _close(*outs)
    if delta is not None:
        _close(hiddens[1], hidden + delta.float())


@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("qkv_dtype", [F32, BF16])
def test_rope_qkv(rows, qkv_dtype):
    torch.manual_seed(0)
    hq, hkv, d, positions = 6, 2, 64, 300
    qkv = torch.randn(rows, (hq + 2 * hkv) * d).to(qkv_dtype)
    pos = torch.randint(0, positions, (rows,))
    angles = torch.rand(positions, d)
    cos, sin = angles.cos().contiguous(), angles.sin().contiguous()
    results = []
    for impl in (fused.REFERENCE, NATIVE):
        q, k, v = torch.empty(rows, hq, d), torch.empty(rows, hkv, d), torch.empty(rows, hkv, d)
        impl.rope_qkv(qkv, pos, cos, sin, q, k, v)
        results.append((q, k, v))
    for a, b in zip(*results, strict=True):
        _close(a, b)
    _close(results[1][2].flatten(1), qkv[:, (hq + hkv) * d :])  # v is copied, not rotated


def test_rope_qkv_rejects_a_position_beyond_the_table():
    cos = torch.ones(8, 4)
    q, k, v = torch.empty(1, 1, 4), torch.empty(1, 1, 4), torch.empty(1, 1, 4)
    with pytest.raises(RuntimeError, match="position 8 outside the table of 8"):
        NATIVE.rope_qkv(torch.randn(1, 12), torch.tensor([8]), cos, cos, q, k, v)


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_silu_mul(rows, dtype):
    torch.manual_seed(0)
    gate_up = (torch.randn(rows, 2 * 96) * 4).to(dtype)
    outs = []
    for impl in (fused.REFERENCE, NATIVE):
        out = torch.empty(rows, 96, dtype=dtype)
        impl.silu_mul(gate_up, out)
        outs.append(out)
    _close(*outs)


def test_shapes_are_checked():
    with pytest.raises(RuntimeError, match="gate_up must hold 2 rows of 8 values"):
        NATIVE.silu_mul(torch.randn(2, 6), torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        NATIVE.silu_mul(torch.randn(2, 8).half(), torch.empty(2, 4))
