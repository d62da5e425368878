"""A GGUF's Q4_0 / Q4_1 matrices packed as int4 straight from their blocks
(``engine/load/gguf_int4.py``): the file's nibbles as they are, its scales (and Q4_1's offsets) rounded
to bf16, the fused QKV and gate+up, a llama file's Q/K row order; the whole engine on a Q4_0 copy
of the default model scores as in fp32 on the same file."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf_files import gguf_py_quantized, write_gguf

from chatpage.bench import common, quality
from chatpage.engine.load.gguf_file import GGUFFile
from chatpage.engine.load.gguf_int4 import int4_of, is_int4, levels_of
from chatpage.engine.load.gguf_model import GGUFSource, gguf_config
from chatpage.engine.load.loader import load_model
from chatpage.engine.model import gemv
from chatpage.engine.model.weights import LAYER_LINEARS, matrix_formats, pack_source

Q = gguf.GGMLQuantizationType
BF16_STEP = 2.0**-8  # bf16's largest relative rounding error is half of this
TOLERANCE = 0.1  # of the fp32 logits' standard deviation: int4's rounding in a tiny model


def _packs(path):
    gf = GGUFFile(path)
    config = gguf_config(gf)
    return (pack_source(config, GGUFSource(gf, config), f) for f in ("int4", "fp32"))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.IQ4_NL, Q.IQ4_XS])
def test_a_q4_matrix_is_its_own_blocks_in_int4(tmp_path, qtype):
    """Every layer matmul of a llama file (Q and K rows permuted by the loader, QKV and gate+up
    fused) dequantizes from its int4 pack to gguf.quants' values (the fp32 pack: bit-exact with
    them) up to the bf16 rounding of the block's scale and zero (IQ4: of its scale, the matrix
    carrying ggml's levels); the lm_head stays int8."""
    int4, fp32 = _packs(write_gguf(tmp_path / "m.gguf", qtype, arch="llama"))
    iq4 = qtype in (Q.IQ4_NL, Q.IQ4_XS)
    for name in (f"layers.0.{x}" for x in LAYER_LINEARS):
        q4, scales, zeros = (int4[name + x] for x in (".q4", ".scales", ".zeros"))
        levels = int4.get(name + ".levels")
        assert (levels is not None) == iq4, name
        got = gemv.dequantize_int4(q4, scales, zeros, levels)
        want = fp32[name + ".weight"]
        if iq4:  # level * scale, the scale rounded: see test_iq4_blocks_are_int4_with_their_levels
            assert ((got - want).abs() <= want.abs() * 2**-8).all(), name
            assert not zeros.any()
            continue
        # a level's error: (q - 8) times the scale's rounding plus the zero's: at most 8 + 1 halves
        # of a bf16 step of the group's largest value
        group = want.view(want.shape[0], -1, gemv.INT4_GROUP).abs().amax(-1, keepdim=True)
        bound = (9 * BF16_STEP / 2 * group).expand(-1, -1, gemv.INT4_GROUP).reshape(want.shape)
        assert ((got - want).abs() <= bound).all(), name
        if qtype == Q.Q4_0:
            assert not zeros.any()
    assert "lm_head.qweight" in int4 and "lm_head.q4" not in int4


def test_a_q8_0_file_is_re_quantized_as_before(tmp_path):
    """A type int4 cannot hold exactly keeps the min/max path: a group spans the 16 levels."""
    int4, _ = _packs(write_gguf(tmp_path / "m.gguf", Q.Q8_0, arch="llama"))
    levels = gemv.unpack_int4(int4["layers.0.o.q4"]).view(-1, gemv.INT4_GROUP)
    assert (levels.amin(-1) == 0).all() and (levels.amax(-1) == 15).all()


def _one_tensor_file(path, qtype, blocks: np.ndarray, rows: int):
    """A GGUF holding one matrix ``w`` of ``rows`` rows stored as ``blocks`` of ``qtype``."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", blocks.reshape(rows, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return GGUFFile(path)


def _iq4_blocks(qtype, n_blocks: int, rng) -> np.ndarray:
    """Random IQ4_NL / IQ4_XS blocks: random nibbles and sub-block scales, an fp16 d of either
    sign, every other one with bf16's 8 significant bits (its block's scales then exact in
    bf16 where d * (ls - 32) needs no more)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    d = (rng.uniform(1e-4, 1e-2, n_blocks) * rng.choice([-1, 1], n_blocks)).astype(np.float16)
    bits = d.view(np.uint16)
    bits[::2] &= 0xFFF8  # fp16 has 11 significant bits: keep 8
    blocks[:, :2] = bits.view(np.uint8).reshape(-1, 2)
    return blocks


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS])
def test_iq4_blocks_are_int4_with_their_levels(tmp_path, qtype):
    """IQ4_NL / IQ4_XS blocks become int4 with ggml's table of levels and zero zeros, and
    dequantize to exactly gguf.quants' values with each scale (d, or IQ4_XS's d * (ls - 32): exact
    in fp32) rounded to bf16: got = level * bf16(scale), want = level * scale, both exact in fp32
    (8 by 8 and 24 significant bits), so |got - want| <= 2^-8 |want| (bf16's unit roundoff: 8
    significant bits), and
    got == want wherever the scale is exact in bf16 (both appear here)."""
    rows, cols = 6, 512
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    blocks = _iq4_blocks(qtype, rows * cols // block, np.random.default_rng(int(qtype)))
    gf = _one_tensor_file(tmp_path / "w.gguf", qtype, blocks, rows)
    assert is_int4(gf, "w")
    q4, scales, zeros = int4_of(gf, "w")
    levels = levels_of(gf.tensors["w"].type_id)
    assert levels is not None and levels.tolist() == list(gguf.quants.IQ4_NL.kvalues)
    assert not zeros.any()
    got = gemv.dequantize_int4(q4, scales, zeros, levels).view(rows, -1, gemv.INT4_GROUP)
    want = torch.from_numpy(gguf.quants.dequantize(blocks, qtype)).view(got.shape)
    level = levels.float()[gemv.unpack_int4(q4).long()].view(got.shape)
    scale = want / level  # exact: no level is 0 and want is an exact product
    assert (scale == scale[..., :1]).all()  # one scale per group of 32
    rounded = scale[..., :1].to(torch.bfloat16).float()
    assert torch.equal(got, level * rounded)
    assert ((got - want).abs() <= want.abs() * 2**-8).all()
    exact = (rounded == scale[..., :1]).squeeze(-1)
    assert exact.any() and not exact.all()
    assert torch.equal(got[exact], want[exact])


def test_an_iq4_nl_model_runs_in_int4_as_in_fp32(tmp_path):
    """End to end: a tiny llama GGUF of IQ4_NL matrices loads in int4 with its levels (no int8
    rows, no note) and runs as the same file in fp32 (the file's values exactly): over a prompt
    its logits stay within TOLERANCE of fp32's spread (int4 differs from it only by rounding: the
    matmuls' inputs and the scales to bf16, the lm_head to int8 rows; measured 0.06), closer
    than int8, which re-quantizes the matrices (measured 0.10)."""
    path = write_gguf(tmp_path / "m.gguf", Q.IQ4_NL, arch="llama")
    fmts = ("int4", "int8", "fp32")
    loaded = {f: load_model(path, progress=lambda _m: None, weights=f) for f in fmts}
    assert not loaded["int4"].warnings
    state = loaded["int4"].state
    assert all(f"layers.0.{x}.levels" in state for x in LAYER_LINEARS)
    assert not any(k.startswith("layers.") and k.endswith(".qweight") for k in state)
    assert list(matrix_formats(state)) == ["int4+levels", "int8"]  # the lm_head: int8 rows
    ids = list(range(40, 104))
    logits = {
        f: quality.all_logits(common.engine(m, weight_dtype=f), ids) for f, m in loaded.items()
    }
    error = {f: (logits[f] - logits["fp32"]).abs().max().item() for f in ("int4", "int8")}
    assert error["int4"] <= TOLERANCE * logits["fp32"].std().item()
    assert error["int4"] < error["int8"]


@pytest.mark.slow  # loads a model file in every format
def test_the_engine_on_a_q4_0_copy_scores_as_in_fp32():
    """Our int4 on a Q4_0 copy of the default model is within 1% of our fp32 on the same file
    (re-quantizing its dequantized values cost +18% against llama.cpp on llama.cpp's Q4_0 file)."""
    loaded = load_model(gguf_py_quantized("Q4_0"), progress=lambda _m: None)
    ids = quality.quality_ids(loaded)[:128]
    ppl = {}
    for fmt in ("fp32", "int4"):
        eng = quality.format_engine(loaded, fmt)
        ppl[fmt] = quality.perplexity(quality.all_logits(eng, ids), ids)
    assert ppl["int4"] / ppl["fp32"] - 1 <= 0.01, ppl
