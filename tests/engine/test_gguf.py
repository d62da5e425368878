"""GGUF files read directly: every tensor type users meet, the checks made before any heavy
work, the tokenizer cache, and the size of the packs (tiny GGUFs written here with gguf-py's
GGUFWriter, plus the real default model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf_files import ALL_TYPES, FFN, HEADS, HIDDEN, Q, gguf, write_gguf

from chatpage.engine.load.gguf_file import TENSOR_TYPES, GGUFError, GGUFFile
from chatpage.engine.load.loader import (
    ModelLoadError,
    default_model_path,
    gguf_cache_dir,
    gguf_tokenizer_dir,
    load_model,
)
from chatpage.engine.model import ops
from chatpage.engine.model.weights import PACKED_LAYOUT, quantize_int8


def test_the_type_table_is_ggmls():
    assert {Q(t).name: (b, s) for t, (_, b, s) in TENSOR_TYPES.items()} == {
        t.name: gguf.GGML_QUANT_SIZES[t] for t in ALL_TYPES
    }


@pytest.mark.slow  # loads and packs model files in processes of their own
def test_the_header_reads_as_gguf_py_reads_it(tmp_path):
    """Our struct reader against GGUFReader on a real file: every key, value and tensor."""
    path = default_model_path()
    ours, theirs = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == pytest.approx(field.contents()), key
    assert len(ours.tensors) == len(theirs.tensors)
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert (info.shape, info.type_id, info.nbytes) == (
            tuple(reversed(t.shape.tolist())),
            t.tensor_type,
            t.n_bytes,
        )
        if t.n_bytes < 1 << 20:
            assert np.array_equal(
                ours.blocks(t.name).reshape(-1).numpy(), t.data.reshape(-1).view(np.uint8)
            )


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda q: q.name)
def test_every_tensor_type_loads_as_gguf_quants_dequantizes_it(tmp_path, qtype):
    """Each type through the loader (fp32: every tensor dequantized under its HF name) equals
    gguf.quants on the bytes GGUFReader finds; an int8 pack of the same file runs."""
    path = write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", qtype)
    loaded = load_model(path, progress=lambda _m: None)
    reader = {t.name: t for t in gguf.GGUFReader(path).tensors}
    want = gguf.quants.dequantize(reader["blk.0.ffn_up.weight"].data, qtype)
    got = loaded.state["model.layers.0.mlp.up_proj.weight"]
    assert got.shape == (FFN, HIDDEN) and torch.isfinite(got).all()
    assert torch.equal(got, torch.from_numpy(np.asarray(want, dtype=np.float32)))
    embed = gguf.quants.dequantize(reader["token_embd.weight"].data, qtype)
    assert torch.equal(loaded.state["model.embed_tokens.weight"], torch.from_numpy(embed))
    assert loaded.config.model_type == "qwen2" and not loaded.config.tie_word_embeddings
    packed = load_model(path, progress=lambda _m: None, weights="int8")
    assert packed.state["layers.0.qkv.qweight"].shape == (HIDDEN + 2 * HIDDEN // 2, HIDDEN)


def test_a_llama_files_q_and_k_rows_come_back_in_hf_order(tmp_path):
    """llama.cpp stores a Llama's Q/K rows with each head's rotary halves interleaved; the loader
    puts them back (row 1 of head 0 in the file is HF's row ``head_dim / 2``)."""
    path = write_gguf(tmp_path / "tiny-llama.gguf", Q.F32, arch="llama")
    q = load_model(path, progress=lambda _m: None).state["model.layers.0.self_attn.q_proj.weight"]
    stored = torch.from_numpy(np.array(gguf.GGUFReader(path).tensors[2].data))
    assert gguf.GGUFReader(path).tensors[2].name == "blk.0.attn_q.weight"
    d = HIDDEN // HEADS
    assert torch.equal(q[0], stored[0]) and torch.equal(q[d // 2], stored[1])
    assert torch.equal(q[1], stored[2]) and torch.equal(q[d + d // 2], stored[d + 1])
    # packed, the fused QKV is dequantized straight into its rows, in the same order
    state = load_model(path, progress=lambda _m: None).state
    qkv = torch.cat([state[f"model.layers.0.self_attn.{x}_proj.weight"] for x in "qkv"])
    packed = load_model(path, progress=lambda _m: None, weights="int8").state
    assert torch.equal(packed["layers.0.qkv.qweight"], quantize_int8(qkv)[0])


PROBE = """
import sys
from chatpage.engine.load.loader import ModelLoadError, load_model
try:
    load_model(sys.argv[1], progress=lambda _m: None, weights="int4")
except ModelLoadError as e:
    print(e)
print("transformers" in sys.modules)
"""


def _refusal(path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()


@pytest.mark.slow  # loads and packs model files in processes of their own
def test_an_unsupported_architecture_is_refused_before_any_heavy_work(tmp_path):
    """One line naming the architecture; no transformers import, nothing dequantized or cached."""
    path = write_gguf(tmp_path / "falcon.gguf", Q.Q8_0, arch="falcon")
    message, imported = _refusal(path)
    assert (
        "unsupported architecture 'falcon'" in message and "qwen3, gemma2, gemma3, phi3" in message
    )
    assert imported == "False" and not gguf_cache_dir(path).exists()


@pytest.mark.slow  # loads and packs model files in processes of their own
def test_an_unknown_tensor_type_is_refused_by_name(tmp_path):
    blocks = np.zeros((4, 66), dtype=np.uint8)  # IQ2_XXS: 256 values in 66 bytes
    path = write_gguf(tmp_path / "iq2.gguf", extra={"blk.0.extra.weight": (blocks, Q.IQ2_XXS)})
    message, imported = _refusal(path)
    assert "tensor 'blk.0.extra.weight' has ggml type 16" in message and "Q4_K" in message
    assert imported == "False"


def test_a_file_that_is_no_gguf_is_one_line(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello")
    with pytest.raises(ModelLoadError, match="is not a GGUF file"):
        load_model(path, progress=lambda _m: None)


@pytest.mark.slow  # loads and packs model files in processes of their own
def test_a_cached_gguf_start_reads_the_tokenizer_without_transformers(tmp_path):
    """The first load builds the tokenizer (transformers' GGUF converter) and caches it; a second
    process reads tokenizer.json and the pack only."""
    path = write_gguf(tmp_path / "tiny.gguf")
    first = load_model(path, progress=lambda _m: None, weights="int4")
    cached = gguf_tokenizer_dir(GGUFFile(path))
    assert json.loads((cached / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    probe = (
        "import sys; from chatpage.engine.load.loader import load_model; "
        "m = load_model(sys.argv[1], progress=lambda _m: None, weights='int4'); "
        "print(m.tokenizer.encode('hi there'), 'transformers' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("]")[1].strip() == "False"
    assert done.stdout.split("]")[0] + "]" == str(first.tokenizer.encode("hi there"))
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in ("hi there", " two  spaces\n<|im_start|>x<|im_end|>", "ünï 🙂"):
        assert first.tokenizer.encode(text) == theirs.encode(text)
        assert first.tokenizer.decode(theirs.encode(text)) == theirs.decode(theirs.encode(text))


@pytest.mark.slow  # the real default model, loaded and packed
def test_the_default_models_int4_pack_is_near_the_files_size():
    """No fp32 copy on disk, and the int4 pack (the default format) within 1.3x the file."""
    path = default_model_path()
    loaded = load_model(None, progress=lambda _m: None, weights="int4")
    files = [f for f in loaded.directory.rglob("*") if f.is_file()]
    pack = loaded.directory / "packed" / f"int4.v{PACKED_LAYOUT}.safetensors"
    assert pack in files and pack.stat().st_size <= 1.3 * path.stat().st_size
    assert not any(f.name == "model.safetensors" for f in files)
    assert not any(k.startswith("embed.") for k in loaded.state)  # tied: the lm_head's int8 rows


@pytest.mark.parametrize("weights", ["bf16", "int8", "int4"])
def test_big_tables_are_packed_by_rows_as_whole(tmp_path, monkeypatch, weights):
    """The embedding and lm_head of a GGUF are converted a chunk of rows at a time (never whole
    in fp32: a 262k-row vocabulary is 0.7 GB): the same packed bytes as the whole table gives."""
    from chatpage.engine.load.gguf_file import GGUFFile
    from chatpage.engine.load.gguf_model import GGUFSource, gguf_config
    from chatpage.engine.model import weights as w

    path = default_model_path()
    gf = GGUFFile(path)
    config = gguf_config(gf)
    source = GGUFSource(gf, config)
    monkeypatch.setattr(w, "ROW_CHUNK", 5000)  # 49,152 rows: 10 chunks, the last one short
    rows, chunks = source.row_chunks("model.embed_tokens.weight", w.ROW_CHUNK)
    assert rows == config.vocab_size and len(list(chunks)) == 10
    by_rows = w._pack_rows(
        "embed.weight", source, "model.embed_tokens.weight", weights, True, torch.float32
    )
    whole = w.pack_tensor("embed.weight", source.load("model.embed_tokens.weight"), weights, True)
    assert by_rows.keys() == whole.keys()
    for key in whole:
        assert torch.equal(by_rows[key], whole[key]), key
    assert source.row_chunks("model.layers.0.self_attn.q_proj.weight", 100) is None  # reordered


@pytest.mark.slow  # loads and packs model files in processes of their own
def test_one_vocabulary_is_converted_once_for_all_its_files(tmp_path, monkeypatch):
    """The tokenizer is cached by what builds it, not by the file: another quantization of the
    same model (same tokenizer metadata) reads it without a conversion; a file whose tokenizer
    metadata differs (its BOS flag) gets its own."""
    monkeypatch.setenv(ops.ENV_CACHE, str(ops.cache_root()))  # the kernels stay where they are
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no conversion of earlier tests
    said: list[str] = []
    a = write_gguf(tmp_path / "m.Q8_0.gguf", Q.Q8_0)
    b = write_gguf(tmp_path / "m.Q4_0.gguf", Q.Q4_0, seed=1)
    c = write_gguf(tmp_path / "m.bos.gguf", Q.Q8_0, add_bos=True)
    load_model(a, progress=said.append, weights="int8")
    assert any("Reading the tokenizer" in s for s in said)
    said.clear()
    loaded = load_model(b, progress=said.append, weights="int8")
    assert not any("Reading the tokenizer" in s for s in said)
    assert gguf_tokenizer_dir(GGUFFile(a)) == gguf_tokenizer_dir(GGUFFile(b))
    assert gguf_tokenizer_dir(GGUFFile(c)) != gguf_tokenizer_dir(GGUFFile(a))
    with_bos = load_model(c, progress=said.append, weights="int8")
    assert any("Reading the tokenizer" in s for s in said)
    assert with_bos.tokenizer.encode("hi") == [
        with_bos.tokenizer.bos_token_id,
        *loaded.tokenizer.encode("hi"),
    ]


def test_a_split_model_loads_from_its_first_part_as_the_whole_file_does(tmp_path):
    """A model split by gguf-split (NAME-00001-of-0000N.gguf, ...) runs from its first part: its
    tensors are those of the same model in one file; a part missing or foreign is one line."""
    whole = write_gguf(tmp_path / "whole.gguf", Q.Q8_0)
    first = write_gguf(tmp_path / "m.gguf", Q.Q8_0, split_max_tensors=4)
    assert first.name == "m-00001-of-00004.gguf"
    split, one = GGUFFile(first), GGUFFile(whole)
    assert len(split.parts) == 4 and split.tensors.keys() == one.tensors.keys()
    for name in one.tensors:
        assert torch.equal(split.dequantize(name), one.dequantize(name))
    a = load_model(first, progress=lambda _m: None, weights="int8")
    b = load_model(whole, progress=lambda _m: None, weights="int8")
    assert a.state.keys() == b.state.keys()
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    last = first.with_name("m-00004-of-00004.gguf")
    last.rename(tmp_path / "aside.gguf")
    with pytest.raises(ModelLoadError, match=r"part 4 of 4 is missing \(m-00004-of-00004.gguf\)$"):
        load_model(first, progress=lambda _m: None)
    (tmp_path / "aside.gguf").rename(last)
    with pytest.raises(GGUFError, match="open a split model by its first part"):
        GGUFFile(first.with_name("m-00002-of-00004.gguf"))
