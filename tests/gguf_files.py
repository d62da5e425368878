"""Tiny GGUF files written with gguf-py's GGUFWriter, as llama.cpp's converter lays them out:
every tensor type users meet, shared by the GGUF, dequant, int4, decode-loop and bench tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
    add_bos: bool | None = None,
    split_max_tensors: int = 0,
) -> Path:
    """A one-layer random model of ``arch`` with every matmul weight in ``qtype`` (those named
    in ``types``, e.g. ``blk.0.ffn_down``, in theirs) and a small byte-level vocabulary (the 256
    byte symbols, one merge and two special tokens); ``add_bos`` written as the converter writes
    ``tokenizer.ggml.add_bos_token`` where given; ``split_max_tensors``: split in parts of that
    many tensors as llama.cpp's gguf-split does (the first part's path is returned)."""
    rng = np.random.default_rng(seed)
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = [*bytes_to_unicode().values(), MERGED, *SPECIALS]
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
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
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
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
    parts = sorted(path.parent.glob(f"{path.stem}-00001-of-*.gguf"))
    return parts[0] if split_max_tensors and parts else path


def gguf_py_quantized(qtype: str = "Q8_0") -> Path:
    """The default model with its matrices quantized by gguf-py's numpy quantizer to ``qtype``
    (from the original file's values), kept in the bench's cache of test models: what the tests
    have where llama-cpp-python's quantizer is not installed (``make test``)."""
    from chatpage.bench import requant
    from chatpage.engine.load.loader import DEFAULT_NAME, default_model_path

    dst = requant.models_dir() / f"{DEFAULT_NAME}.gguf-py-{qtype}.gguf"
    if dst.is_file():
        return dst
    return requant.copy_as(default_model_path(), dst, Q[qtype])
