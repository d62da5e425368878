"""The fused decode-step ops on CUDA (csrc/cuda/fused.cu) against the torch reference: the checks
of tests/fused_checks.py on a GPU, for every dtype the kernels read and write."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fused_checks import (  # noqa: E402
    BF16,
    F32,
    check_add_rms_norm,
    check_rope_qkv,
    check_silu_mul,
)

from chatpage.engine.model import fused  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

F16 = torch.float16
DEVICE = "cuda"


@pytest.fixture(scope="module")
def native() -> fused.FusedOps:
    ops = fused.for_model(torch.device(DEVICE), F32)
    assert ops.native
    return ops


@pytest.mark.parametrize("rows", [1, 37, 300])
@pytest.mark.parametrize("delta_dtype", [None, F32, F16, BF16])
@pytest.mark.parametrize("out_dtype", [F32, F16, BF16])
def test_add_rms_norm(native, rows, delta_dtype, out_dtype):
    check_add_rms_norm(native, DEVICE, rows, delta_dtype, out_dtype)


@pytest.mark.parametrize("rows", [1, 33])
@pytest.mark.parametrize("qkv_dtype", [F32, F16, BF16])
def test_rope_qkv(native, rows, qkv_dtype):
    check_rope_qkv(native, DEVICE, rows, qkv_dtype)


@pytest.mark.parametrize("rows", [1, 40])
@pytest.mark.parametrize("dtype", [F32, F16, BF16])
def test_silu_mul(native, rows, dtype):
    check_silu_mul(native, DEVICE, rows, dtype)


def test_tensors_on_another_device_are_refused(native):
    with pytest.raises(RuntimeError, match="same CUDA device"):
        native.silu_mul(torch.randn(2, 8, device=DEVICE), torch.empty(2, 4))
