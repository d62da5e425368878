"""The default model re-quantized to another GGUF type (``bench/requant.py``, gguf-py's quantizer:
what `make test` has; llama.cpp's own quantizer is `make test-peers`'): the copy keeps every
metadata key, and our engine on it scores the text as on the original."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_files import gguf_py_quantized

from chatpage.bench import quality, requant
from chatpage.engine.load.gguf_file import GGUFFile
from chatpage.engine.load.loader import default_model_path, load_model

# of bench/data/quality.txt: over 128 the int8 perplexity moved by up to 1% (half its goal) when
# the attention's summation order moved its outputs by 1e-6 (five such runs: 36.85 to 37.17,
# fp32 36.39); over 256 those runs stay within 0.35%
TOKENS = 256


@pytest.fixture(scope="module")
def q8_file():
    return gguf_py_quantized("Q8_0")


def test_a_requantized_copy_is_the_original_in_q8_0_blocks(q8_file):
    """Every key but the file type as the original's; each matrix exactly gguf.quants' Q8_0 of
    the original's values; norms in F32."""
    ours, original = GGUFFile(q8_file), GGUFFile(default_model_path())
    assert ours.metadata.pop("general.file_type") == 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    original.metadata.pop("general.file_type")
    assert ours.metadata == original.metadata
    assert list(ours.tensors) == list(original.tensors)
    kinds = {(len(t.shape), t.type_name) for t in ours.tensors.values()}
    assert kinds == {(2, "Q8_0"), (1, "F32")}
    for name in ("blk.0.ffn_up.weight", "blk.29.attn_k.weight"):
        want = gguf.quants.quantize(
            original.dequantize(name).numpy(), gguf.GGMLQuantizationType.Q8_0
        )
        assert np.array_equal(ours.blocks(name).numpy().reshape(want.shape), want)


@pytest.mark.slow
def test_the_engine_on_the_q8_0_file_scores_as_on_the_original(q8_file):
    """Perplexity on the same tokens: ours on the Q8_0 file in fp32 within 0.3% of ours on the
    original Q4_1 file (which tests/engine/test_engine.py holds to transformers' forward), and in int8
    (the nearest format to Q8_0) within the int8 format's goal against fp32."""
    from chatpage.bench import common

    def scores(path, formats):
        loaded = load_model(path, progress=lambda _m: None)
        ids = quality.quality_ids(loaded)[:TOKENS]
        out = {}
        for fmt in formats:
            eng = common.engine(loaded, weight_dtype=fmt)
            out[fmt] = quality.perplexity(quality.all_logits(eng, ids), ids)
        return out

    (original,) = scores(None, ["fp32"]).values()
    ours = scores(q8_file, ["fp32", "int8"])
    assert abs(ours["fp32"] / original - 1) <= 0.003, (ours, original)
    assert ours["int8"] / ours["fp32"] - 1 <= quality.GOAL_PPL_DELTA["int8"], ours


@pytest.mark.peers
def test_llamacpps_own_q8_0_file_scores_within_1pct_of_llamacpp():
    """A file made by llama.cpp's quantizer (from the F16 copy): our perplexity in the file's own
    precision against llama.cpp's on the same file and tokens (``bench quality``'s comparison)."""
    path = requant.llamacpp_quantized("Q8_0")
    row = quality.compare_file(path, ["int8"])
    assert row["own_format"] == "int8" and row["matrix_types"].keys() == {"Q8_0"}
    assert abs(row["delta_vs_llamacpp"]["fp32"]) <= 0.01, row
    assert row["met"], row


@pytest.mark.slow  # runs a benchmark end to end
def test_the_bos_copy_is_the_default_model_with_a_tokenizer_that_adds_a_bos():
    """``requant.with_bos``: every tensor's blocks and every key as the original's but
    ``tokenizer.ggml.add_bos_token``; our tokenizer of it puts the BOS before the quality text,
    and ``bench quality`` says so (the default model's puts none)."""
    path = requant.with_bos()
    ours, original = GGUFFile(path), GGUFFile(default_model_path())
    assert ours.metadata.pop("tokenizer.ggml.add_bos_token") is True
    assert original.metadata.pop("tokenizer.ggml.add_bos_token") is False
    assert ours.metadata == original.metadata
    assert list(ours.tensors) == list(original.tensors)
    for name in ours.tensors:
        assert np.array_equal(ours.blocks(name).numpy(), original.blocks(name).numpy()), name

    def text_ids(model):
        loaded = load_model(model, progress=lambda _m: None)
        ids = quality.quality_ids(loaded)
        return ids, quality.bos_added(loaded, ids)

    (with_bos, added), (plain, plain_added) = text_ids(path), text_ids(None)
    assert added and not plain_added and with_bos[1:] == plain


@pytest.mark.peers
def test_with_a_bos_on_both_sides_the_perplexity_is_llamacpps():
    """On a file whose tokenizer asks for a BOS, llama.cpp's own ids of the quality text are ours
    (its BOS first) and our perplexity on them is within 1% of llama.cpp's."""
    row = quality.compare_file(requant.with_bos(), ["int4"])
    assert row["bos_added"] and row["llamacpp_bos_added"] and row["same_ids_as_llamacpp"], row
    assert abs(row["delta_vs_llamacpp"]["fp32"]) <= 0.01, row
    assert row["met"], row
