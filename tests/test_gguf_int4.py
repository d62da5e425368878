"""A GGUF's Q4_0 / Q4_1 matrices packed as int4 straight from their blocks
(``engine/gguf_int4.py``): the file's nibbles as they are, its scales (and Q4_1's offsets) rounded
to bf16, the fused QKV and gate+up, a llama file's Q/K row order; the whole engine on a Q4_0 copy
of the default model scores as in fp32 on the same file."""

from __future__ import annotations

import gguf
import pytest
import torch

from chatpage.bench import quality, requant
from chatpage.engine import gemv
from chatpage.engine.gguf_file import GGUFFile
from chatpage.engine.gguf_model import GGUFSource, gguf_config
from chatpage.engine.loader import load_model
from chatpage.engine.weights import LAYER_LINEARS, pack_source
from tests.test_gguf import write_gguf

Q = gguf.GGMLQuantizationType
BF16_STEP = 2.0**-8  # bf16's largest relative rounding error is half of this


def _packs(path):
    gf = GGUFFile(path)
    config = gguf_config(gf)
    return (pack_source(config, GGUFSource(gf, config), f) for f in ("int4", "fp32"))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1])
def test_a_q4_matrix_is_its_own_blocks_in_int4(tmp_path, qtype):
    """Every layer matmul of a llama file (Q and K rows permuted by the loader, QKV and gate+up
    fused) dequantizes from its int4 pack to gguf.quants' values (the fp32 pack: bit-exact with
    them) up to the bf16 rounding of the block's scale and zero; the lm_head stays int8."""
    int4, fp32 = _packs(write_gguf(tmp_path / "m.gguf", qtype, arch="llama"))
    for name in (f"layers.0.{x}" for x in LAYER_LINEARS):
        q4, scales, zeros = (int4[name + x] for x in (".q4", ".scales", ".zeros"))
        got = gemv.dequantize_int4(q4, scales, zeros)
        want = fp32[name + ".weight"]
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


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS])
def test_int4_of_a_non_uniform_4_bit_file_is_its_int8(tmp_path, qtype):
    """IQ4_NL / IQ4_XS levels are not evenly spaced: int4 of such a file stores every matrix as
    int8 rows (the int8 pack's very tensors), the pack still saying int4."""
    path = write_gguf(tmp_path / "m.gguf", qtype, arch="llama")
    gf = GGUFFile(path)
    config = gguf_config(gf)
    int4, int8 = (pack_source(config, GGUFSource(gf, config), f) for f in ("int4", "int8"))
    assert "format.int4" in int4 and not any(k.endswith(".q4") for k in int4)
    del int4["format.int4"], int8["format.int8"]
    assert int4.keys() == int8.keys()
    assert all(torch.equal(int4[k], int8[k]) for k in int4)
    (note,) = load_model(path, progress=lambda _m: None, weights="int4").warnings
    assert qtype.name in note and "int8" in note


def test_the_engine_on_a_q4_0_copy_scores_as_in_fp32():
    """Our int4 on a Q4_0 copy of the default model is within 1% of our fp32 on the same file
    (re-quantizing its dequantized values cost +18% against llama.cpp on llama.cpp's Q4_0 file)."""
    loaded = load_model(requant.gguf_py_quantized("Q4_0"), progress=lambda _m: None)
    ids = quality.quality_ids(loaded)[:128]
    ppl = {}
    for fmt in ("fp32", "int4"):
        eng = quality.format_engine(loaded, fmt)
        ppl[fmt] = quality.perplexity(quality.all_logits(eng, ids), ids)
    assert ppl["int4"] / ppl["fp32"] - 1 <= 0.01, ppl
