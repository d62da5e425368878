"""engine/load/dequant.py and the native kernel (csrc/cpu/dequant.cpp) against gguf-py's numpy
``gguf.quants`` (tested bit-exact against ggml): every tensor type, on random blocks whose fp16
scales are finite, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_files import SCALE_OFFSETS

from chatpage.engine.load.dequant import DEQUANTIZE, dequantize
from chatpage.engine.load.gguf_file import TENSOR_TYPES
from chatpage.engine.model import ops

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
# where each block keeps its fp16 scales (ggml's block structs): set to finite values here
SCALES = {Q.Q4_0: (0,), Q.Q4_1: (0, 2), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q8_0: (0,), **SCALE_OFFSETS}


def _blocks(qtype: Q, n: int, seed: int) -> np.ndarray:
    """``n`` random blocks of ``qtype``: every bit random but the scales', which are finite fp16
    of either sign over a wide range (plain floats: finite values of every exponent)."""
    rng = np.random.default_rng(seed)
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    if qtype == Q.F32:
        return rng.standard_normal(n * 64).astype(np.float32).view(np.uint8).reshape(n, -1)
    if qtype in (Q.F16, Q.BF16):
        values = rng.standard_normal(n * 64).astype(np.float32) * 10.0 ** rng.integers(-6, 6)
        half = values.astype(np.float16) if qtype == Q.F16 else gguf.quants.quantize(values, qtype)
        return np.ascontiguousarray(half).view(np.uint8).reshape(n, -1)
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    for at in SCALES[qtype]:
        scales = rng.uniform(-1, 1, n) * 10.0 ** rng.integers(-5, 2, n)
        blocks[:, at : at + 2] = scales.astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks


def test_every_type_the_loader_reads_has_a_dequantizer():
    assert set(DEQUANTIZE) == set(TENSOR_TYPES)


def _native(blocks: torch.Tensor, type_id: int) -> torch.Tensor:
    assert ops.available("cpu")
    _, values, size = TENSOR_TYPES[type_id]
    out = torch.full((blocks.numel() // size * values,), float("nan"))
    torch.ops.chatpage.dequantize_gguf(blocks, type_id, out)
    return out


@pytest.mark.parametrize("path", [dequantize, _native], ids=["torch", "native"])
@pytest.mark.parametrize("type_id", sorted(TENSOR_TYPES), ids=lambda t: TENSOR_TYPES[t][0])
def test_each_type_dequantizes_bit_exactly_as_gguf_quants(type_id, path):
    qtype = Q(type_id)
    blocks = _blocks(qtype, 96, seed=type_id)
    want = np.asarray(gguf.quants.dequantize(blocks, qtype), dtype=np.float32)
    got = path(torch.from_numpy(blocks.copy()), type_id)
    assert np.isfinite(want).all() and got.dtype == torch.float32
    assert got.numel() == want.size
    assert np.array_equal(got.reshape(want.shape).numpy().view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("type_id", [8, 12], ids=["Q8_0", "Q4_K"])
def test_the_native_dequantizer_takes_rows_in_a_given_order(type_id):
    """llama.cpp's Q/K rows are put back in HF's order as they are dequantized."""
    blocks = torch.from_numpy(_blocks(Q(type_id), 96, seed=7).copy())
    _, values, _ = TENSOR_TYPES[type_id]
    order = torch.randperm(12, generator=torch.Generator().manual_seed(0))
    want = dequantize(blocks, type_id).view(12, -1).index_select(0, order)
    out = torch.empty(12, 96 * values // 12)
    torch.ops.chatpage.dequantize_gguf(blocks, type_id, out, order)
    assert torch.equal(out, want)
