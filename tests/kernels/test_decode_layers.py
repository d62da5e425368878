"""The native decode loop (``torch.ops.chatpage.decode_layers``, csrc/cpu/decode.cpp) runs the
same kernels in the same order as the Python layer loop, so every output is the same bits."""

from __future__ import annotations

import sys

import pytest
import torch
from gguf_files import Q, write_gguf

from chatpage.bench import common
from chatpage.engine import SamplingParams
from chatpage.engine.load.loader import load_model
from chatpage.engine.model import ops, weights
from chatpage.engine.model.llama import NativeLayers
from chatpage.engine.model.weights import GEMM_ROWS, GEMV_ROWS


def _every_step(fmt: str) -> bool:
    """Whether the native loop takes every step in ``fmt``: its matrices are q8 packs (one kernel
    for any rows), or its GEMM starts right after its GEMV (no torch path between), so prefill
    steps run natively too."""
    if fmt in ("int8", "int4") and weights.q8_packs(32, fmt):
        return weights.q8_pack_rows(fmt) == sys.maxsize
    return GEMM_ROWS.get(fmt) == GEMV_ROWS[fmt] + 1


def _run(loaded, fmt: str, native: bool, monkeypatch) -> tuple[list, list[int]]:
    """Greedy outputs (ids, logprobs, alternatives) of three concurrent prompts, then of one
    alone, and the rows of each step that ran through the native loop."""
    eng = common.engine(loaded, weight_dtype=fmt)
    layers = eng.model.native_layers
    assert isinstance(layers, NativeLayers)
    assert layers.packed == (fmt in ("int8", "int4") and weights.q8_packs(32, fmt))
    if layers.packed:
        assert layers.rows == weights.q8_pack_rows(fmt)
        assert layers.gemm_rows == 0 and layers.parts == 2
    elif _every_step(fmt):
        assert layers.rows == sys.maxsize and layers.gemm_rows == GEMM_ROWS[fmt]
    else:
        assert layers.rows == GEMV_ROWS[fmt] and layers.gemm_rows == 0
    if not native:
        eng.model.native_layers = None
    calls = []
    real = NativeLayers.__call__
    monkeypatch.setattr(
        NativeLayers, "__call__", lambda self, s: calls.append(s.h.shape[0]) or real(self, s)
    )
    # one row a sequence a decode step (no drafts): the step counts below assume it
    params = SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, logprobs=3, speculate=False
    )
    together = eng.generate([list(range(100, 100 + n)) for n in (5, 21, 40)], params)
    alone = eng.generate([list(range(150, 183))], params)  # (ids any vocabulary here holds)
    got = [(c.token_ids, c.logprobs, c.top_logprobs) for o in together + alone for c in o.outputs]
    return got, calls


@pytest.mark.parametrize("kind", ["llama", "qwen2"])  # qwen2: biases on q, k and v
@pytest.mark.parametrize(
    ("fmt", "packs"),
    # the app's format in the quick loop, the others with the slow tests (a second or more each)
    [
        pytest.param(f, p, marks=() if (f, p) == ("int4", True) else pytest.mark.slow)
        for f, p in [("fp32", False), ("bf16", False)]
        + [(f, p) for f in ("int8", "int4") for p in (True, False)]
    ],
    ids=["fp32", "bf16", "int8", "int8-no-packs", "int4", "int4-no-packs"],
)
def test_the_native_loop_gives_the_python_loops_bits(kind, fmt, packs, request, monkeypatch):
    """(no-packs: int8 and int4 matrices as the GEMVs and GEMMs take them where a CPU has no q8
    packs, or a matrix is not whole 32-row tasks.)"""
    if not packs:
        monkeypatch.setattr(weights, "q8_packs", lambda _rows, _fmt: False)
    loaded = load_model(request.getfixturevalue(f"tiny_{kind}_dir"), progress=lambda _m: None)
    native, steps = _run(loaded, fmt, True, monkeypatch)
    python, none = _run(loaded, fmt, False, monkeypatch)
    assert native == python
    # the decode steps went native: three rows at once for fp32, bf16 and int8, the lone
    # prompt's for int4 too (its GEMV takes one row); where the GEMMs follow the GEMVs, the
    # prefill steps too (the three prompts' 53 rows up to their last full blocks at once, past
    # every GEMM's first row; their tails are a chunk of their own: Scheduler._tail_apart)
    assert len(steps) >= (11 if fmt == "int4" else 22) and none == []
    assert (max(steps) == 5 + 16 + 32) == _every_step(fmt)


def test_bad_arguments_are_refused():
    assert ops.available("cpu")
    t = torch.zeros(1)
    op = torch.ops.chatpage.decode_layers

    def call(norms, weights, parts, *gemm):
        """One layer's call with these norms, weights and parts (and gemm_rows, q8, packed)."""
        head, caches, tail = (t,) * 4, ([t], [t]), (t,) * 4 + (1e-5, 1.0, [0]) + (t,) * 6
        return op(*head, norms, weights, [None] * len(weights), parts, *caches, *tail, *gemm)

    with pytest.raises(
        RuntimeError,
        match="parts must be 1 .fp32, bf16., 2 .int8., 3 .int4. or 4 .int4 with levels., got 5",
    ):
        call([], [], 5)
    with pytest.raises(RuntimeError, match="for 1 layers expected 1 value caches, 2 norms"):
        call([t], [t] * 4, 1)
    with pytest.raises(RuntimeError, match="fp32 weights have no GEMM"):
        call([t, t], [t] * 4, 1, 5, False)
    with pytest.raises(RuntimeError, match="q8 packs take 2 parts per matrix .* got 1"):
        call([t, t], [t] * 4, 1, 0, False, True)


def test_int4_with_and_without_levels_gives_the_python_loops_bits(tmp_path, monkeypatch):
    """A GGUF of IQ4_NL matrices (int4 with their table of levels) but for a Q8_0 ffn_down
    (re-quantized: int4's own levels q - 8): the native loop takes four parts per matmul (as q8
    packs two), an empty levels tensor for the uniform one, and gives the Python loop's bits."""
    path = write_gguf(tmp_path / "m.gguf", Q.IQ4_NL, arch="llama", types={"blk.0.ffn_down": Q.Q8_0})
    loaded = load_model(path, progress=lambda _m: None, weights="int4")
    assert "layers.0.qkv.levels" in loaded.state and "layers.0.down.levels" not in loaded.state
    layers = common.engine(loaded, weight_dtype="int4").model.native_layers
    assert layers.parts == (2 if layers.packed else 4)  # (a pack's levels: its second part)
    native, steps = _run(loaded, "int4", True, monkeypatch)
    python, _ = _run(loaded, "int4", False, monkeypatch)
    assert native == python and len(steps) >= 11
