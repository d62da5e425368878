"""The fused decode-step kernels (csrc/cpu/fused.cpp) match their torch reference
(chatpage/engine/model/fused.py) for every dtype pair the model uses, at batch 1 and for many rows."""

from __future__ import annotations

import pytest
import torch
from fused_checks import BF16, F32, check_add_rms_norm, check_rope_qkv, check_silu_mul

from chatpage.engine.model import fused, ops

NATIVE = fused.for_model(torch.device("cpu"), torch.float32)


def test_the_model_gets_the_native_ops_only_where_they_apply():
    assert ops.available("cpu") and NATIVE.native
    assert not fused.for_model(torch.device("cpu"), BF16).native
    assert not fused.for_model(torch.device("meta"), F32).native


@pytest.mark.parametrize("rows", [1, 37])
@pytest.mark.parametrize("delta_dtype", [None, F32, BF16])
@pytest.mark.parametrize("out_dtype", [F32, BF16])
def test_add_rms_norm(rows, delta_dtype, out_dtype):
    check_add_rms_norm(NATIVE, "cpu", rows, delta_dtype, out_dtype)


@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("qkv_dtype", [F32, BF16])
def test_rope_qkv(rows, qkv_dtype):
    check_rope_qkv(NATIVE, "cpu", rows, qkv_dtype)


def test_rope_qkv_rejects_a_position_beyond_the_table():
    cos = torch.ones(8, 4)
    q, k, v = torch.empty(1, 1, 4), torch.empty(1, 1, 4), torch.empty(1, 1, 4)
    with pytest.raises(RuntimeError, match="position 8 outside the table of 8"):
        NATIVE.rope_qkv(torch.randn(1, 12), torch.tensor([8]), cos, cos, q, k, v)


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("dtype", [F32, BF16])
def test_silu_mul(rows, dtype):
    check_silu_mul(NATIVE, "cpu", rows, dtype)


def test_shapes_are_checked():
    with pytest.raises(RuntimeError, match="gate_up must hold 2 rows of 8 values"):
        NATIVE.silu_mul(torch.randn(2, 6), torch.empty(2, 4))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        NATIVE.silu_mul(torch.randn(2, 8).half(), torch.empty(2, 4))
