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

from chatpage.engine.gguf_file import TENSOR_TYPES, GGUFFile
from chatpage.engine.loader import ModelLoadError, default_model_path, gguf_cache_dir, load_model
from chatpage.engine.weights import PACKED_LAYOUT, quantize_int8

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
HIDDEN, FFN, HEADS, KV_HEADS = 256, 512, 4, 2  # K-quant rows need inputs in multiples of 256
SPECIALS = ["<|im_start|>", "<|im_end|>"]
MERGED = "\u0120t"  # " t" in byte-level symbols: the one merge of the test vocabulary
# where each type the numpy quantizer lacks keeps its fp16 scales (ggml's block structs)
SCALE_OFFSETS = {
    Q.Q2_K: (80, 82),
    Q.Q3_K: (108,),
    Q.Q4_K: (0, 2),
    Q.Q5_K: (0, 2),
    Q.Q6_K: (208,),
    Q.IQ4_NL: (0,),
    Q.IQ4_XS: (0,),
}
ALL_TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, *SCALE_OFFSETS]


def _iq4_nl(values: np.ndarray) -> np.ndarray:
    """``values`` as IQ4_NL blocks (gguf.quants has no quantizer for it): each block's largest
    magnitude on the level -127, every value on its nearest level."""
    levels = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)
    groups = values.reshape(-1, 32)
    big = groups[np.arange(len(groups)), np.abs(groups).argmax(-1)]
    d = (big / -127).astype(np.float16)
    q = np.abs(groups[..., None] - d.astype(np.float32)[:, None, None] * levels).argmin(-1)
    nibbles = (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)
    blocks = np.concatenate([d.view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return blocks.reshape(values.shape[0], -1)


def _stored(rng: np.random.Generator, rows: int, cols: int, qtype: Q) -> np.ndarray:
    """A [rows, cols] tensor in ``qtype`` as GGUFWriter takes it: quantized by gguf.quants where
    it can, else random blocks with sane fp16 scales."""
    values = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if qtype in (Q.F32, Q.F16):
        return values.astype(np.float16 if qtype == Q.F16 else np.float32)
    if qtype not in SCALE_OFFSETS:
        return gguf.quants.quantize(values, qtype)
    if qtype == Q.IQ4_NL:
        return _iq4_nl(values)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // block, size), dtype=np.uint8)
    for at in SCALE_OFFSETS[qtype]:
        scales = (rng.uniform(1e-4, 1e-2, len(blocks))).astype(np.float16)
        blocks[:, at : at + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def write_gguf(
    path: Path,
    qtype: Q = Q.Q8_0,
    arch: str = "qwen2",
    seed: int = 0,
    extra: dict[str, tuple[np.ndarray, Q]] | None = None,
    types: dict[str, Q] | None = None,
) -> Path:
    """A one-layer random model of ``arch`` with every matmul weight in ``qtype`` (those named
    in ``types``, e.g. ``blk.0.ffn_down``, in theirs) and a small byte-level vocabulary (the 256
    byte symbols, one merge and two special tokens)."""
    rng = np.random.default_rng(seed)
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [*bytes_to_unicode().values(), MERGED, *SPECIALS]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 257 + [3, 3])
    w.add_token_merges([" ".join(MERGED)])
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_chat_template(
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    )
    d = HIDDEN // HEADS
    shapes = {
        "token_embd": (len(tokens), HIDDEN),
        "output": (len(tokens), HIDDEN),
        "blk.0.attn_q": (HIDDEN, HIDDEN),
        "blk.0.attn_k": (KV_HEADS * d, HIDDEN),
        "blk.0.attn_v": (KV_HEADS * d, HIDDEN),
        "blk.0.attn_output": (HIDDEN, HIDDEN),
        "blk.0.ffn_gate": (FFN, HIDDEN),
        "blk.0.ffn_up": (FFN, HIDDEN),
        "blk.0.ffn_down": (HIDDEN, FFN),
    }
    for name, (rows, cols) in shapes.items():
        own = (types or {}).get(name, qtype)
        w.add_tensor(f"{name}.weight", _stored(rng, rows, cols, own), raw_dtype=own)
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(f"{name}.weight", (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
    for name, rows in (("attn_q", HIDDEN), ("attn_k", KV_HEADS * d), ("attn_v", KV_HEADS * d)):
        w.add_tensor(f"blk.0.{name}.bias", (0.1 * rng.standard_normal(rows)).astype(np.float32))
    for name, (data, raw) in (extra or {}).items():
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_the_type_table_is_ggmls():
    assert {Q(t).name: (b, s) for t, (_, b, s) in TENSOR_TYPES.items()} == {
        t.name: gguf.GGML_QUANT_SIZES[t] for t in ALL_TYPES
    }


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
from chatpage.engine.loader import ModelLoadError, load_model
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


def test_an_unsupported_architecture_is_refused_before_any_heavy_work(tmp_path):
    """One line naming the architecture; no transformers import, nothing dequantized or cached."""
    path = write_gguf(tmp_path / "falcon.gguf", Q.Q8_0, arch="falcon")
    message, imported = _refusal(path)
    assert (
        "unsupported architecture 'falcon'" in message and "qwen3, gemma2, gemma3, phi3" in message
    )
    assert imported == "False" and not gguf_cache_dir(path).exists()


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


def test_a_cached_gguf_start_reads_the_tokenizer_without_transformers(tmp_path):
    """The first load builds the tokenizer (transformers' GGUF converter) and caches it; a second
    process reads tokenizer.json and the pack only."""
    path = write_gguf(tmp_path / "tiny.gguf")
    first = load_model(path, progress=lambda _m: None, weights="int4")
    cached = gguf_cache_dir(path)
    assert json.loads((cached / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"
    probe = (
        "import sys; from chatpage.engine.loader import load_model; "
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
    from chatpage.engine import weights as w
    from chatpage.engine.gguf_file import GGUFFile
    from chatpage.engine.gguf_model import GGUFSource, gguf_config

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
