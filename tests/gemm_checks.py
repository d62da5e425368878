"""The tiled GEMMs (csrc/cpu/gemm.cpp) against their torch references (chatpage/engine/gemv.py),
shared by tests/test_gemm.py's in-process tests (this machine's build) and its AVX2 build, which
runs this file as a script in a process of its own (a second kernel library cannot be loaded
beside the first): ``python tests/gemm_checks.py CACHE_DIR`` builds with ``ops.AVX2_CFLAGS``,
runs every case and prints how many passed."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

from chatpage.engine import gemv, ops

BF16, F32 = torch.bfloat16, torch.float32
# rows: below, at and past the 4-row (AVX2: 2-row) tile, with leftovers; outputs: fewer than a
# block of 6, blocks plus leftovers; inputs: not a multiple of 16 (int8, bf16), one int4 group,
# an odd number of groups, more than one 768-input chunk
ROWS = [2, 5, 13, 70]
OUTPUTS = [7, 21]
INPUTS = {"bf16": [40, 576, 1600], "int8": [40, 576, 1600], "int4": [32, 96, 1600]}
CASES = [
    (fmt, m, n, k, dtype, bias)
    for fmt in ("bf16", "int8", "int4")
    for m, n, k, dtype, bias in itertools.product(
        ROWS, OUTPUTS, INPUTS[fmt], (F32, BF16), (False, True)
    )
]


def check_case(fmt: str, m: int, n: int, k: int, dtype: torch.dtype, with_bias: bool) -> None:
    """One call of ``gemm_<fmt>`` equals its reference (the kernel only sums in another order)."""
    torch.manual_seed(m * 10_000 + n * 100 + k)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n) if with_bias else None
    lib = torch.ops.chatpage
    match fmt:
        case "bf16":
            w = torch.randn(n, k).to(BF16)
            got, want = lib.gemm_bf16(x, w, bias), gemv.reference_bf16(x, w, bias)
        case "int8":
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            scales = (torch.rand(n) / 100).to(BF16)
            got, want = lib.gemm_int8(x, q, scales, bias), gemv.reference_int8(x, q, scales, bias)
        case "int4":
            q = gemv.pack_int4(torch.randint(0, 16, (n, k)))
            scales = (torch.rand(n, k // gemv.INT4_GROUP) / 10).to(BF16)
            zeros = (torch.randn(n, k // gemv.INT4_GROUP) / 10).to(BF16)
            got = lib.gemm_int4(x, q, scales, zeros, bias)
            want = gemv.reference_int4(x, q, scales, zeros, bias)
    assert got.dtype == want.dtype == dtype and got.shape == (m, n)
    tol = 1e-2 if dtype == BF16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def main(cache_dir: Path) -> None:
    loader = ops.KernelLoader(cache_dir=cache_dir, cflags=ops.AVX2_CFLAGS)
    assert loader.load(), loader.status()
    for case in CASES:
        check_case(*case)
    print(f"{len(CASES)} passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
