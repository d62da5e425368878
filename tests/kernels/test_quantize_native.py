"""The native int4 and int8 packing (csrc/cpu/quantize.cpp) against its torch references
(weights.quantize_int4 + gemv.pack_int4, weights.quantize_int8): the same bytes."""

from __future__ import annotations

import pytest
import torch

from chatpage.engine.model import ops
from chatpage.engine.model.weights import (
    int4_packed,
    int8_rows,
    pack_int4,
    quantize_int4,
    quantize_int8,
)


def _matrices() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(40, 256, generator=g) * 0.05
    wide = torch.randn(24, 128, generator=g) * 10.0 ** torch.randint(-6, 3, (24, 1), generator=g)
    levels = torch.randint(0, 16, (16, 96), generator=g).float()
    q41 = (levels - 8) * 0.01 + 0.003  # a GGUF Q4_1-like grid: every group spans its levels
    flat = torch.zeros(8, 64)
    flat[1] = 0.5  # constant groups: the scale's floor
    return {"normal": normal, "wide": wide, "q4_1": q41, "flat": flat}


@pytest.mark.parametrize("kind", list(_matrices()))
def test_the_native_packing_gives_the_references_bytes(kind):
    assert ops.available("cpu")
    w = _matrices()[kind]
    want4 = pack_int4(*quantize_int4(w), "m")
    got4 = int4_packed(w, "m")
    assert set(got4) == set(want4)
    for name, t in want4.items():
        assert got4[name].dtype == t.dtype and torch.equal(got4[name], t), name
    q, s = quantize_int8(w)
    gq, gs = int8_rows(w)
    assert torch.equal(gq, q) and torch.equal(gs, s)
