"""The few-row matmul kernels (csrc/cpu/gemv.cpp) match their torch reference
(chatpage/engine/model/gemv.py) on this machine's build and on an AVX2 build of the same sources
(``-mno-avx512f``, its own process and cache), on shapes that exercise every tail
(tests/gemv_checks.py); and make_linear uses them for few rows, torch's path or the GEMMs
(tests/kernels/test_gemm.py) for more, with the same answers."""

from __future__ import annotations

import sys

import pytest
import torch
from gemv_checks import CASES, check_op
from kernel_checks import run_other_build

from chatpage.engine.load.dequant import IQ4_LEVELS
from chatpage.engine.model import gemv, ops
from chatpage.engine.model.weights import (
    GEMM_ROWS,
    GEMV_ROWS,
    Q8_FORMATS,
    gemm_kernel,
    make_linear,
    pack_int4,
    q8_pack_rows,
    q8_packs,
    quantize_int4,
)

LIB = torch.ops.chatpage
BF16, F32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True, scope="module")
def _native_kernels():
    """The native build loaded before any case, so that a case run alone finds its op too."""
    assert ops.load(), ops.status()


def test_the_kernels_are_loaded():
    assert ops.available("cpu")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_gemvs_match_the_reference(case):
    check_op("gemv", *case)


@pytest.mark.slow  # the kernels built for another ISA, run in a process of their own
def test_the_avx2_build_matches_the_reference():
    """The same checks against a build without AVX-512 (vec.h's eight-lane paths)."""
    assert run_other_build("gemv_checks.py")[-2:] == [str(len(CASES)), "passed"]


def test_int4_layout_round_trips_and_dequantizes():
    torch.manual_seed(0)
    levels = torch.randint(0, 16, (5, 64))
    q = gemv.pack_int4(levels)
    assert q.shape == (5, 32) and q.dtype == torch.uint8
    assert torch.equal(gemv.unpack_int4(q), levels.to(torch.uint8))
    # byte j of a group: input j low, input j + 16 high
    assert q[0, 0].item() == levels[0, 0].item() | levels[0, 16].item() << 4
    ones = torch.ones(5, 2, dtype=BF16)
    w = gemv.dequantize_int4(q, ones * 2, ones)
    torch.testing.assert_close(w, (levels.float() - 8) * 2 + 1)
    table = torch.randint(-128, 128, (16,), dtype=torch.int8)
    w = gemv.dequantize_int4(q, ones * 2, ones, table)
    assert torch.equal(w, table[levels].float() * 2 + 1)


def test_bad_arguments_are_refused():
    x = torch.randn(1, 64)
    with pytest.raises(RuntimeError, match="x has 64 inputs, the weight 32"):
        LIB.gemv_fp32(x, torch.randn(4, 32), None)
    with pytest.raises(RuntimeError, match="gemv_bf16: weight must be bfloat16"):
        LIB.gemv_bf16(x, torch.randn(4, 64), None)
    q4, ones = torch.zeros(4, 32, dtype=torch.uint8), torch.ones(4, 2, dtype=BF16)
    with pytest.raises(RuntimeError, match="scales and zeros must be contiguous bfloat16"):
        LIB.gemv_int4(x, q4, torch.ones(4, 1), torch.ones(4, 1), None, None)
    for levels in (torch.zeros(8, dtype=torch.int8), torch.zeros(16, dtype=torch.int32)):
        with pytest.raises(RuntimeError, match="levels must be 16 contiguous int8 values"):
            LIB.gemv_int4(x, q4, ones, ones, levels, None)
    with pytest.raises(RuntimeError, match="one value per output row"):
        LIB.gemv_int8(
            x, torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, dtype=BF16), torch.ones(3)
        )


def _levels_state(n: int, k: int) -> dict[str, torch.Tensor]:
    """A random int4 matrix with a table of levels of its own (IQ4_NL's)."""
    state = pack_int4(*quantize_int4(torch.randn(n, k)), "m")
    state["m.levels"] = torch.tensor(IQ4_LEVELS, dtype=torch.int8)
    state["m.scales"] = (state["m.scales"].float() / 16).to(BF16)
    return state


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int4", "int4+levels"])
def test_make_linear_agrees_below_and_above_the_cut_overs(fmt):
    """Few rows take the GEMV, from GEMM_ROWS on the GEMM (csrc/cpu/gemm.cpp; fp32 has none),
    torch's path between and beyond; row for row the answers agree. int4 with levels never
    reaches torch's int4pack (it cannot hold them): the GEMV takes every row below the GEMM's.
    (48 outputs: torch's int4 packing needs multiples of 16, and a q8 pack takes 32s, which the
    next test checks.)"""
    torch.manual_seed(0)
    n, k = 48, 96
    w = torch.randn(n, k)
    gemv_rows = GEMV_ROWS.get(fmt, GEMM_ROWS["int4"] - 1)
    if fmt == "int4+levels":
        state = _levels_state(n, k)
        parts = [state["m.q4"], state["m.scales"], state["m.zeros"], state["m.levels"]]
        fmt = "int4"
    elif fmt == "int4":
        state = pack_int4(*quantize_int4(w), "m")
        parts = [state["m.q4"], state["m.scales"], state["m.zeros"], None]
    elif fmt == "int8":
        state = {
            "m.qweight": torch.randint(-127, 128, (n, k), dtype=torch.int8),
            "m.scales": (torch.rand(n) / 100).to(BF16),
        }
        parts = [state["m.qweight"], state["m.scales"]]
    else:
        state = {"m.weight": w.to(BF16) if fmt == "bf16" else w}
        parts = [state["m.weight"]]
    state["m.bias"] = torch.randn(n)
    linear = make_linear(state, "m", torch.device("cpu"))
    assert linear.gemv is not None and linear.gemv.rows == gemv_rows
    dtype = F32 if fmt == "fp32" else BF16
    x = torch.randn(GEMM_ROWS.get(fmt, GEMV_ROWS[fmt]) + 3, k).to(dtype)
    one_by_one = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])
    tol = atol = 1e-4 if fmt == "fp32" else 2e-2
    if fmt == "int4" and torch.ops.chatpage.gemm_amx():
        tol = atol = 5e-2  # the GEMM on AMX tiles rounds the decoded weights to bf16
    if gemm_kernel(fmt).startswith("gemm_q8"):
        # the q8 GEMMs quantize the activations to int8 blocks (an error of about 1% of the
        # outputs' size), the GEMV does not
        tol, atol = 5e-2, 0.03 * one_by_one.float().abs().max().item()
    for rows in sorted({GEMV_ROWS[fmt] + 1, GEMM_ROWS.get(fmt, x.shape[0]), x.shape[0]}):
        torch.testing.assert_close(
            linear(x[:rows]).float(), one_by_one[:rows].float(), rtol=tol, atol=atol
        )
    if fmt in GEMM_ROWS:  # from GEMM_ROWS on it is the GEMM itself
        bias = state["m.bias"].to(dtype if fmt == "bf16" else F32)
        gemm = getattr(LIB, gemm_kernel(fmt))
        assert torch.equal(linear(x), gemm(x, *parts, bias))
    if "m.levels" in state:  # and every row count below the GEMM's the GEMV itself
        few = x[:gemv_rows]
        assert torch.equal(linear(few), LIB.gemv_int4(few, *parts, state["m.bias"]))


@pytest.mark.parametrize("fmt", ["int8", "int4", "int4+levels"])
def test_make_linear_takes_a_q8_pack_on_a_cpu_with_vnni(fmt):
    """On an AVX-512 CPU without AMX whose build has the q8 GEMMs, an int8 or int4 matrix of
    whole 32-row tasks is laid out once at load (a q8 pack) and every row count runs the packed
    q8 GEMM: row for row the same bits as the unpacked q8 GEMM, whatever the batch."""
    torch.manual_seed(0)
    n, k = 64, 96
    if fmt == "int8":
        state = {
            "m.qweight": torch.randint(-127, 128, (n, k), dtype=torch.int8),
            "m.scales": (torch.rand(n) / 100).to(BF16),
        }
        unpacked = lambda x: LIB.gemm_q8_int8(x, state["m.qweight"], state["m.scales"], bias)  # noqa: E731
    else:
        state = (
            _levels_state(n, k)
            if fmt == "int4+levels"
            else pack_int4(*quantize_int4(torch.randn(n, k)), "m")
        )
        parts = [state["m.q4"], state["m.scales"], state["m.zeros"], state.get("m.levels")]
        unpacked = lambda x: LIB.gemm_q8_int4(x, *parts, bias)  # noqa: E731
    bias = torch.randn(n)
    state["m.bias"] = bias
    linear = make_linear(state, "m", torch.device("cpu"))
    kind = fmt.partition("+")[0]
    packs = kind in Q8_FORMATS.get(ops.vector_isa(), ()) and LIB.gemm_q8()
    assert q8_packs(n, kind) == packs and not q8_packs(n + 16, kind)
    if not packs:  # pragma: no cover - a CPU without the q8 GEMMs for kind
        assert linear.gemv is not None and linear.gemv.op != getattr(LIB, f"gemm_q8_{kind}_packed")
        return
    assert linear.gemv is not None and linear.gemv.op == getattr(LIB, f"gemm_q8_{kind}_packed")
    pack_rows = q8_pack_rows(kind)
    assert linear.gemv.rows == pack_rows
    # with AMX the AMX GEMM takes the rows past the pack's
    assert (linear.gemm is None) == (pack_rows == sys.maxsize)
    x = torch.randn(70, k).to(BF16)
    one_by_one = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])
    for rows in (1, 3, 4, 9, 32, 70):
        if rows > pack_rows:
            assert linear.gemm is not None and torch.equal(linear(x[:rows]), linear.gemm(x[:rows]))
            continue
        assert torch.equal(linear(x[:rows]), one_by_one[:rows])
        assert torch.equal(linear(x[:rows]), unpacked(x[:rows]))


def test_without_the_kernels_a_matrix_with_levels_runs_dequantized(monkeypatch):
    """torch's int4pack cannot hold a table of levels: without the native kernels such a matrix
    runs dequantized (fp32 weights, the reference's product up to the order of its sums)."""
    state = _levels_state(32, 96)
    state["m.bias"] = torch.randn(32)
    monkeypatch.setattr(ops, "available", lambda _device: False)
    linear = make_linear(state, "m", torch.device("cpu"))
    assert linear.gemv is None
    x = torch.randn(5, 96).to(BF16)
    parts = (state["m." + p] for p in ("q4", "scales", "zeros", "levels", "bias"))
    want = gemv.reference_int4(x, *parts)
    torch.testing.assert_close(linear(x).float(), want.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("n", [32, 96, 48])
def test_torchs_int4pack_of_the_gemvs_nibbles_computes_the_reference(n):
    """The int4 pack holds the GEMV's nibbles only; torch's layout, derived from them at load
    (it depends on the CPU: AMX machines pair neighbouring rows), multiplies as the reference."""
    torch.manual_seed(n)
    q, scales, zeros = quantize_int4(torch.randn(n, 96))
    q4 = gemv.pack_int4(q)
    sz = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
    x = torch.randn(3, 96).to(BF16)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(x, gemv.torch_int4pack(q4), 32, sz)
    want = gemv.reference_int4(x, q4, scales, zeros, None, None)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=1e-2)
