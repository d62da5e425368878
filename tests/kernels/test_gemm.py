"""The many-row matmul kernels (csrc/cpu/gemm.cpp, and the q8 GEMMs of csrc/cpu/gemm_q8.cpp: AVX-512
VNNI's or AVX2's) match their torch references on this machine's build, on an AVX-512
build without AMX and on an AVX2 build of the same sources (``-mno-amx-tile``, ``-mno-avx512f``:
each in its own process and cache), on shapes that exercise every tail (tests/kernels/test_gemv.py checks
that make_linear picks them by the step's rows)."""

from __future__ import annotations

import pytest
import torch
from gemm_checks import CASES, Q8_CASES
from gemv_checks import check_op
from kernel_checks import run_other_build

from chatpage.engine.model import ops

BF16 = torch.bfloat16


@pytest.fixture(autouse=True, scope="module")
def _native_kernels():
    """The native build loaded before any case, so that a case run alone finds its op too."""
    assert ops.load(), ops.status()


def test_the_kernels_are_loaded():
    assert ops.available("cpu")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_gemms_match_the_reference(case):
    check_op("gemm", *case)


def _q8() -> bool:
    """Whether -march=native builds the q8 GEMMs here: AVX-512 VNNI, or AVX2 (and FMA)."""
    flags = set(ops._cpu_features().split())
    return {"avx512_vnni", "avx512bw", "avx512vl"} <= flags or {"avx2", "fma"} <= flags


@pytest.mark.parametrize("case", Q8_CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_q8_gemms_match_the_reference(case):
    assert ops.load()
    if not torch.ops.chatpage.gemm_q8():  # pragma: no cover - a CPU without AVX2
        assert not _q8()
        return
    check_op("gemm_q8", *case)


def test_the_q8_gemms_are_built_where_the_cpu_has_avx2_or_vnni():
    """-march=native builds them exactly on a CPU with AVX2 or AVX-512 VNNI; elsewhere they
    refuse with a clear error instead of running."""
    assert ops.load()
    lib = torch.ops.chatpage
    assert lib.gemm_q8() == _q8()
    if not lib.gemm_q8():  # pragma: no cover - a CPU without AVX2
        x, q = torch.randn(2, 32), torch.zeros(4, 32, dtype=torch.int8)
        with pytest.raises(RuntimeError, match="gemm_q8_int8: this build has no q8 GEMMs"):
            lib.gemm_q8_int8(x, q, torch.ones(4, dtype=BF16), None)


def test_the_q8_gemm_is_close_to_the_exact_product():
    """Quantizing the activations to int8 blocks costs little: on the default model's shapes the
    q8 reference is within 1% (relative to the output's spread) of the exact product."""
    from chatpage.engine.model import gemv

    torch.manual_seed(1)
    x = torch.randn(16, 576)
    w = torch.randn(960, 576) / 24
    q, s = gemv.quantize_q8(w)[0].view(960, 576), (w.abs().amax(-1) / 127).to(BF16)
    exact = gemv.reference_int8(x, q, s, None)
    approx = gemv.reference_q8_int8(x, q, s, None)
    assert ((approx - exact).norm() / exact.norm()).item() < 0.01


@pytest.mark.slow  # the kernels built for another ISA, run in a process of their own
def test_the_avx2_build_matches_the_reference():
    """The same checks against a build without AVX-512 (vec.h's eight-lane paths, and the q8
    GEMMs' maddubs path: int4 nibbles, int8 weights and tables of levels by the sign trick)."""
    want = len(CASES) + (len(Q8_CASES) if _q8() else 0)
    assert run_other_build("gemm_checks.py")[-2:] == [str(want), "passed"]


@pytest.mark.slow  # the kernels built for another ISA, run in a process of their own
def test_the_build_without_amx_matches_the_reference():
    """The same checks against a build without AMX (an AVX-512 machine's fp32-FMA GEMMs and its
    q8 GEMMs, which take this machine's own build on a CPU without AMX)."""
    want = len(CASES) + (len(Q8_CASES) if _q8() else 0)
    assert run_other_build("gemm_checks.py", "no-amx")[-2:] == [str(want), "passed"]


def test_the_gemms_run_on_amx_where_the_cpu_has_it():
    """On a CPU with AMX tiles (and a kernel that grants them) the native build's GEMMs take
    them, so the reference checks above ran the AMX path; elsewhere they do not."""
    assert ops.load()
    flags = set(ops._cpu_features().split())
    assert torch.ops.chatpage.gemm_amx() == ({"amx_tile", "amx_bf16", "avx512_bf16"} <= flags)
    # the cut-overs between the kernels (engine/model/weights.py) are AMX's exactly where they run on it
    assert (ops.vector_isa() == "amx") == torch.ops.chatpage.gemm_amx()


def test_bad_arguments_are_refused():
    x = torch.randn(8, 64)
    lib = torch.ops.chatpage
    with pytest.raises(RuntimeError, match="gemm_bf16: weight must be bfloat16"):
        lib.gemm_bf16(x, torch.randn(4, 64), None)
    with pytest.raises(RuntimeError, match="gemm_int8: x has 64 inputs, the weight 32"):
        lib.gemm_int8(x, torch.zeros(4, 32, dtype=torch.int8), torch.ones(4, dtype=BF16), None)
    with pytest.raises(RuntimeError, match="gemm_int8: scales must be bfloat16"):
        lib.gemm_int8(x, torch.zeros(4, 64, dtype=torch.int8), torch.ones(3, dtype=BF16), None)
    q4 = torch.zeros(4, 32, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="gemm_int4: scales and zeros must be contiguous"):
        lib.gemm_int4(x, q4, torch.ones(4, 1), torch.ones(4, 1), None, None)
    ones, levels = torch.ones(4, 2, dtype=BF16), torch.zeros(17, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="gemm_int4: levels must be 16 contiguous int8"):
        lib.gemm_int4(x, q4, ones, ones, levels, None)
    with pytest.raises(RuntimeError, match="gemm_q8_int4: scales and zeros must be contiguous"):
        lib.gemm_q8_int4(x, q4, torch.ones(4, 1), torch.ones(4, 1), None, None)
    with pytest.raises(RuntimeError, match="gemm_q8_int8: x has 64 inputs, the weight 32"):
        lib.gemm_q8_int8(x, torch.zeros(4, 32, dtype=torch.int8), torch.ones(4, dtype=BF16), None)
    # q8 packs: whole tasks of 32 rows, and a product over a pack of the right shape
    with pytest.raises(RuntimeError, match="the matrix has 48 rows; a pack takes a multiple of 32"):
        lib.q8_pack_int8(torch.zeros(48, 64, dtype=torch.int8))
    with pytest.raises(RuntimeError, match="q8_pack_int4: the matrix has 4 rows; a pack takes"):
        lib.q8_pack_int4(q4, torch.ones(4, 2, dtype=BF16), torch.ones(4, 2, dtype=BF16))
    pack8, pack4 = torch.zeros(32, 64, dtype=torch.uint8), torch.zeros(32, 20, dtype=torch.uint8)
    with pytest.raises(
        RuntimeError, match="int8_packed: x has 100 inputs, the pack 2 blocks of 32"
    ):
        lib.gemm_q8_int8_packed(torch.randn(8, 100), pack8, torch.ones(32, dtype=BF16), None)
    with pytest.raises(RuntimeError, match="scales must be bfloat16 with one value per row"):
        lib.gemm_q8_int8_packed(x, pack8, torch.ones(31, dtype=BF16), None)
    with pytest.raises(RuntimeError, match="pack must be q8_pack_int4's uint8 .N, blocks . 20."):
        lib.gemm_q8_int4_packed(x, pack8[:, :50], None, None)
    with pytest.raises(RuntimeError, match="gemm_q8_int4_packed: x has 64 inputs, the weight 32"):
        lib.gemm_q8_int4_packed(x, pack4, None, None)
