"""The few-row matmuls (csrc/cpu/gemv.cpp) against their torch references (chatpage/engine/model/gemv.py),
shared by tests/kernels/test_gemv.py's in-process tests (this machine's build) and its AVX2 build, which
runs this file as a script in a process of its own (a second kernel library cannot be loaded
beside the first): ``python tests/gemv_checks.py CACHE_DIR avx2`` builds with ``ops.AVX2_CFLAGS``,
runs every case and prints how many passed."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

from chatpage.engine.model import gemv, ops

BF16, F32 = torch.bfloat16, torch.float32
# rows: one row, a full tile (AVX-512: 4, AVX2: 2), partial tiles and several tiles; outputs:
# fewer rows than a block, blocks of four (int4 with AVX-512: eight) plus leftovers; inputs: not a
# multiple of 8 or 16 (AVX2's and AVX-512's lanes), the default model's hidden size; int4 groups:
# one, an odd count (AVX-512 decodes two at a time), more than 16 with leftovers
ROWS = [1, 2, 3, 5, 9]
OUTPUTS = [7, 21]
INPUTS = {"fp32": [45, 576], "bf16": [45, 576], "int8": [45, 576], "int4": [32, 96, 576]}


def level_cases(rows, outputs, inputs) -> list[tuple]:
    """The checks of int4 with levels: every combination, fp32 and bf16, a bias every other."""
    return [
        ("int4+levels", m, n, k, dtype, m % 2 == 0)
        for m, n, k, dtype in itertools.product(rows, outputs, inputs, (F32, BF16))
    ]


CASES = [
    (fmt, m, n, k, dtype, bias)
    for fmt in ("fp32", "bf16", "int8", "int4")
    for m, n, k, dtype, bias in itertools.product(
        ROWS, OUTPUTS, INPUTS[fmt], (F32, BF16), (False, True)
    )
]
# int4 with a table of levels of its own ("int4+levels": the int4 kernels given ``levels``) at
# every row count up to 8 (a matrix with levels takes the GEMV for every row below the GEMM's)
CASES += level_cases(range(1, 9), OUTPUTS, INPUTS["int4"])


def q8_exact(rows: int, k: int) -> torch.Tensor:
    """bf16 activations [rows, k] that the q8 GEMMs quantize exactly (integers, each block of 32
    holding a 127: scale 1), so a product over them is exact on every kernel."""
    x = torch.randint(-127, 128, (rows, k)).float()
    x[:, :: gemv.Q8_BLOCK] = 127
    return x.to(BF16)


def weights_of(fmt: str, n: int, k: int) -> tuple[torch.Tensor | None, ...]:
    """Random [N, K] weights in ``fmt``, as the kernels and references take them (int4+levels:
    random int8 levels over their whole range, -128 included)."""
    match fmt:
        case "fp32":
            return (torch.randn(n, k),)
        case "bf16":
            return (torch.randn(n, k).to(BF16),)
        case "int8":
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8)
            return q, (torch.rand(n) / 100).to(BF16)
    groups = k // gemv.INT4_GROUP
    q = gemv.pack_int4(torch.randint(0, 16, (n, k)))
    zeros = (torch.randn(n, groups) / 10).to(BF16)
    if fmt == "int4":
        return q, (torch.rand(n, groups) / 10).to(BF16), zeros, None
    levels = torch.randint(-128, 128, (16,), dtype=torch.int8)
    levels[0] = -128
    return q, (torch.rand(n, groups) / 1000).to(BF16), zeros, levels


def check_op(
    op: str, fmt: str, m: int, n: int, k: int, dtype: torch.dtype, with_bias: bool
) -> None:
    """One call of ``<op>_<fmt>`` (op: gemv, gemm or gemm_q8; int4+levels: the int4 kernel with
    levels) equals its reference (the kernel only sums in another order)."""
    torch.manual_seed(m * 10_000 + n * 100 + k)
    x = torch.randn(m, k).to(dtype)
    bias = torch.randn(n) if with_bias else None
    weights = weights_of(fmt, n, k)
    kind = fmt.partition("+")[0]
    got = getattr(torch.ops.chatpage, f"{op}_{kind}")(x, *weights, bias)
    reference = getattr(gemv, f"reference_q8_{kind}" if op == "gemm_q8" else f"reference_{kind}")
    if op == "gemm" and kind == "int4" and torch.ops.chatpage.gemm_amx():
        want = reference(x, *weights, bias, bf16_weights=True)
    else:
        want = reference(x, *weights, bias)
    assert got.dtype == want.dtype == dtype and got.shape == (m, n)
    tol = 1e-2 if dtype == BF16 else 1e-4
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    if op == "gemm_q8" and n % 32 == 0:  # a q8 pack: the same kernel on bytes laid out once
        assert torch.equal(packed_product(kind, x, weights, bias), got)


def packed_product(
    kind: str, x: torch.Tensor, weights: tuple[torch.Tensor | None, ...], bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ W.T (+ bias)`` by the q8 GEMM on a pack of ``weights`` (``weights_of``'s tensors)."""
    lib = torch.ops.chatpage
    if kind == "int8":
        q, scales = weights
        return lib.gemm_q8_int8_packed(x, lib.q8_pack_int8(q), scales, bias)
    q, scales, zeros, levels = weights
    return lib.gemm_q8_int4_packed(x, lib.q8_pack_int4(q, scales, zeros), levels, bias)


def run_cases_on_build(
    op: str, cases: list[tuple], cache_dir: Path, build: str, q8: list[tuple] = ()
) -> None:
    """Every case of ``op`` against the build ``ops.TEST_BUILDS[build]`` in ``cache_dir``, and the
    ``q8`` cases of the q8 GEMMs where that build has them (``gemm_q8()``); prints how many
    passed."""
    loader = ops.KernelLoader(cache_dir=cache_dir, cflags=ops.TEST_BUILDS[build])
    assert loader.load(), loader.status()
    for case in cases:
        check_op(op, *case)
    with_q8 = list(q8) if torch.ops.chatpage.gemm_q8() else []
    for case in with_q8:
        check_op("gemm_q8", *case)
    if q8 and not with_q8:  # a build without them refuses a pack clearly
        try:
            torch.ops.chatpage.q8_pack_int8(torch.zeros(32, 32, dtype=torch.int8))
        except RuntimeError as e:
            assert "q8_pack_int8: this build has no q8 GEMMs" in str(e), e
        else:
            raise AssertionError("q8_pack_int8 ran on a build without the q8 GEMMs")
    print(f"{len(cases) + len(with_q8)} passed")


if __name__ == "__main__":
    run_cases_on_build("gemv", CASES, Path(sys.argv[1]), sys.argv[2])
