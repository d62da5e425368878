"""GGUF files for the quality and load benchmarks and the tests (issue 21 item 5): the default model
at other precisions, and models of Qwen2.5-0.5B's and Gemma 3 270M's sizes made of the default
model's weights (`SHAPES`). Made once, kept under the
cache's ``test-models/`` (never in git); each call returns the cached file when it is there.

The source of every re-quantized file is an F16 GGUF written here from the default file's tensors
(dequantized by ``engine/load/gguf_file.py``) with gguf-py's writer, every metadata key of the original
copied (architecture keys, tokenizer, chat template; ``general.file_type`` set to F16), so
llama.cpp's own quantizer (``llama_model_quantize`` of llama-cpp-python) starts from 16 bits, as
from a converted checkpoint. IQ4_NL needs no importance matrix in llama.cpp (only the 1-2-bit IQ
types do), so none is used for any type. Where llama-cpp-python is not installed (``make test``),
the tests make such copies with gguf-py's numpy quantizer instead (``tests/gguf_files.py``:
``gguf_py_quantized``) through :func:`copy_as`.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatpage.config.paths import cache_dir
from chatpage.engine.load.gguf_file import GGUFFile
from chatpage.engine.load.loader import DEFAULT_NAME, default_model_path
from chatpage.vocab import UserError

# The files issue 21 asks for, by llama.cpp's name of the file type (its ``LLAMA_FTYPE_MOSTLY_*``)
LLAMACPP_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "Q4_0", "IQ4_NL")
F16_FILE_TYPE = 1  # general.file_type of an F16 file (llama.cpp's LLAMA_FTYPE_MOSTLY_F16)


@dataclass(frozen=True)
class Shape:
    """A published model's sizes, for a file of real-looking weights in them (:func:`shaped`)."""

    name: str  # the file's name
    arch: str  # its GGUF architecture
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    keys: tuple[tuple[str, float], ...] = ()  # more architecture keys (float-valued)


SHAPES = {
    # Qwen2.5-0.5B's config.json: tied embeddings, QKV biases
    "qwen05": Shape("Qwen2.5-0.5B-shaped", "qwen2", 896, 24, 14, 2, 64, 4864, 151936),
    # Gemma 3 270M's: a 262,144-token vocabulary (a 168M-parameter tied embedding), 5 sliding
    # layers of 512 to 1 full, q/k norms and Gemma's four norms a layer
    "gemma270": Shape(
        "Gemma-3-270M-shaped",
        "gemma3",
        640,
        18,
        4,
        1,
        256,
        2048,
        262144,
        (("attention.sliding_window", 512), ("rope.freq_base_swa", 10000.0)),
    ),
}
"""The shaped files ``--files`` names; their weights are the default model's, tiled."""


class MissingPeer(UserError):
    """llama-cpp-python is needed and not installed; the message says how to install it."""


def models_dir() -> Path:
    return cache_dir() / "test-models"


# Only the rows of these tensors are quantized by gguf-py's quantizer (llama.cpp's rule too: norms
# and biases stay F32)
def _is_matrix(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and name.endswith(".weight")


Tensor = tuple[str, tuple[int, ...], Any, Callable[[], np.ndarray]]  # name, shape, raw type, data


@contextmanager
def _written(dst: Path) -> Iterator[Path]:
    """A temporary path beside ``dst`` that becomes ``dst`` when the block ends without error."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", suffix=".gguf", dir=dst.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, dst)
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_gguf(
    dst: Path, arch: str, fields: dict[str, tuple[Any, Any, Any]], tensors: list[Tensor]
) -> Path:
    """Write a GGUF of ``arch`` with ``fields`` (key -> (value, value type, item type)) and
    ``tensors``, each made by its function only when written (one in memory at a time)."""
    import gguf

    with _written(dst) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch)
        for key, (value, vtype, sub) in fields.items():
            w.add_key_value(key, value, vtype, sub)
        for name, shape, raw, _ in tensors:
            block, size = gguf.GGML_QUANT_SIZES[raw]
            nbytes = int(np.prod(shape)) // block * size
            w.add_tensor_info(name, shape, np.dtype(np.float32), nbytes, raw_dtype=raw)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for _, _, _, make in tensors:
            w.write_tensor_data(make())
        w.close()
    return dst


def source_fields(path: Path) -> dict[str, tuple[Any, Any, Any]]:
    """Every metadata key of ``path`` but the architecture (the writer adds it) and the file
    type, with the value types gguf-py read."""
    import gguf

    fields = {}
    for key, field in gguf.GGUFReader(path).fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        fields[key] = (field.contents(), field.types[0], sub)
    return fields


def _file_type(value: int) -> dict[str, tuple[Any, Any, Any]]:
    import gguf

    return {"general.file_type": (value, gguf.GGUFValueType.UINT32, None)}


def copy_as(src: Path, dst: Path, qtype: Any) -> Path:
    """``src`` written again with every weight matrix in ``qtype`` (F16, or a type gguf-py's
    numpy quantizer has) and the rest in F32, metadata copied."""
    import gguf

    gf = GGUFFile(src)
    arch = gf.metadata["general.architecture"]

    def make(name: str, raw: Any) -> Callable[[], np.ndarray]:
        def data() -> np.ndarray:
            values = gf.dequantize(name).numpy()
            if raw == gguf.GGMLQuantizationType.F32:
                return values
            if raw == gguf.GGMLQuantizationType.F16:
                return values.astype(np.float16)
            return gguf.quants.quantize(values, raw)

        return data

    tensors: list[Tensor] = []
    for name, info in gf.tensors.items():
        raw = qtype if _is_matrix(name, info.shape) else gguf.GGMLQuantizationType.F32
        tensors.append((name, info.shape, raw, make(name, raw)))
    ftype = gguf.LlamaFileType["MOSTLY_" + gguf.GGMLQuantizationType(qtype).name]
    return write_gguf(dst, arch, {**source_fields(src), **_file_type(int(ftype))}, tensors)


def f16_source(src: Path | None = None) -> Path:
    """The default model (or ``src``) as an F16 GGUF: the quantizer's input."""
    import gguf

    src = src or default_model_path()
    dst = models_dir() / f"{_stem(src)}.F16.gguf"
    return dst if dst.is_file() else copy_as(src, dst, gguf.GGMLQuantizationType.F16)


def _stem(src: Path) -> str:
    return DEFAULT_NAME if src == default_model_path() else src.stem


def llamacpp_quantize(src: Path, dst: Path, file_type: str, threads: int = 1) -> Path:
    """``src`` quantized to llama.cpp's ``file_type`` (``Q4_K_M``, ...) by llama.cpp itself."""
    try:
        import llama_cpp
    except ImportError:
        raise MissingPeer(
            "llama.cpp's quantizer needs llama-cpp-python: run `make bench-peers` or "
            '`CMAKE_ARGS="$(scripts/llamacpp_cmake_args.sh)" .venv/bin/pip install llama-cpp-python`'
        ) from None
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{file_type}")
    params.nthread = threads
    with _written(dst) as tmp:
        status = llama_cpp.llama_model_quantize(
            str(src).encode(), str(tmp).encode(), ctypes.byref(params)
        )
        if status != 0:
            raise RuntimeError(f"llama.cpp could not quantize {src.name} to {file_type}")
    return dst


def llamacpp_quantized(file_type: str, threads: int = 1) -> Path:
    """The default model as llama.cpp's ``file_type`` (one of :data:`LLAMACPP_TYPES`), quantized
    from its F16 copy by llama.cpp."""
    dst = models_dir() / f"{DEFAULT_NAME}.llamacpp-{file_type}.gguf"
    if dst.is_file():
        return dst
    return llamacpp_quantize(f16_source(), dst, file_type, threads)


def _shaped_fields(shape: Shape, seed_src: Path) -> dict[str, tuple[Any, Any, Any]]:
    """The default model's tokenizer and chat template (its vocabulary padded to ``shape``'s
    with unreachable tokens) under ``shape``'s architecture keys and sizes."""
    import gguf

    T = gguf.GGUFValueType
    fields = {k: v for k, v in source_fields(seed_src).items() if not k.startswith("llama.")}
    tokens, types = fields["tokenizer.ggml.tokens"][0], fields["tokenizer.ggml.token_type"][0]
    pad = shape.vocab - len(tokens)
    fields["tokenizer.ggml.tokens"] = (
        tokens + [f"<|pad{i}|>" for i in range(pad)],
        T.ARRAY,
        T.STRING,
    )
    fields["tokenizer.ggml.token_type"] = (types + [1] * pad, T.ARRAY, T.INT32)
    fields.pop("tokenizer.ggml.scores", None)
    sizes = {
        "context_length": 32768,
        "embedding_length": shape.hidden,
        "block_count": shape.layers,
        "feed_forward_length": shape.ffn,
        "attention.head_count": shape.heads,
        "attention.head_count_kv": shape.kv_heads,
        "attention.key_length": shape.head_dim,
        "attention.value_length": shape.head_dim,
    }
    a = shape.arch
    fields.update({f"{a}.{k}": (v, T.UINT32, None) for k, v in sizes.items()})
    fields[f"{a}.rope.freq_base"] = (1000000.0, T.FLOAT32, None)
    fields[f"{a}.attention.layer_norm_rms_epsilon"] = (1e-6, T.FLOAT32, None)
    for key, value in shape.keys:
        kind = T.UINT32 if isinstance(value, int) else T.FLOAT32
        fields[f"{a}.{key}"] = (value, kind, None)
    fields["general.name"] = (shape.name, T.STRING, None)
    return {**fields, **_file_type(F16_FILE_TYPE)}


def _tiled(values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values`` repeated along each dimension and cut to ``shape``."""
    reps = [-(-n // m) for n, m in zip(shape, values.shape, strict=True)]
    return np.tile(values, reps)[tuple(slice(0, n) for n in shape)]


def _shaped_tensors(shape: Shape, seed_src: Path) -> list[Tensor]:
    """Tensors of ``shape`` made of the default model's own (each from the tensor of the same
    role in layer i mod its 30, tiled to size): real weights' scale distributions, which the
    K-quants' costs and errors depend on (random normal weights are kinder)."""
    import gguf

    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    seed = GGUFFile(seed_src)
    seed_layers = int(seed.metadata["llama.block_count"])
    q, kv, h = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden
    gemma = shape.arch.startswith("gemma")

    def made(
        src: str, size: tuple[int, ...], raw: Any, norm: bool = False
    ) -> tuple[tuple[int, ...], Any, Callable[[], np.ndarray]]:
        def data() -> np.ndarray:
            values = _tiled(seed.dequantize(src).numpy(), size)
            values = values + 1 if norm and gemma else values  # Gemma files store 1 + w
            return values.astype(np.float16 if raw == F16 else np.float32)

        return size, raw, data

    out: list[Tensor] = [
        ("token_embd.weight", *made("token_embd.weight", (shape.vocab, h), F16)),
        ("output_norm.weight", *made("output_norm.weight", (h,), F32, True)),
    ]
    matrices = {
        "attn_q": (q, h),
        "attn_k": (kv, h),
        "attn_v": (kv, h),
        "attn_output": (h, q),
        "ffn_gate": (shape.ffn, h),
        "ffn_up": (shape.ffn, h),
        "ffn_down": (h, shape.ffn),
    }
    norms = {"attn_norm": ("attn_norm", h), "ffn_norm": ("ffn_norm", h)}
    if gemma:
        norms |= {
            "post_attention_norm": ("ffn_norm", h),
            "post_ffw_norm": ("attn_norm", h),
            "attn_q_norm": ("attn_norm", shape.head_dim),
            "attn_k_norm": ("attn_norm", shape.head_dim),
        }
    for i in range(shape.layers):
        src = f"blk.{i % seed_layers}."
        for name, size in matrices.items():
            out.append((f"blk.{i}.{name}.weight", *made(src + name + ".weight", size, F16)))
        if shape.arch == "qwen2":  # QKV biases: the attn_norm's values, centred
            for name, n in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
                bias = made(src + "attn_norm.weight", (n,), F32)
                out.append((f"blk.{i}.{name}.bias", *bias))
        for name, (like, n) in norms.items():
            out.append((f"blk.{i}.{name}.weight", *made(src + like + ".weight", (n,), F32, True)))
    return out


def shaped(which: str, file_type: str = "Q4_K_M", threads: int = 1) -> Path:
    """A model of the sizes of :data:`SHAPES` ``which`` with the default model's weights tiled
    into them, as llama.cpp's ``file_type``: written in F16 here, then quantized by llama.cpp
    (the F16 file is removed), or that F16 file itself (``file_type`` F16: no llama.cpp)."""
    shape = SHAPES[which]
    dst = models_dir() / f"{shape.name}.{file_type}.gguf"
    if dst.is_file():
        return dst
    f16 = models_dir() / f"{shape.name}.F16.gguf"
    src = default_model_path()
    write_gguf(f16, shape.arch, _shaped_fields(shape, src), _shaped_tensors(shape, src))
    if file_type == "F16":
        return f16
    try:
        return llamacpp_quantize(f16, dst, file_type, threads)
    finally:
        f16.unlink(missing_ok=True)


def with_bos() -> Path:
    """The default model whose tokenizer asks for a BOS before a text
    (``tokenizer.ggml.add_bos_token``; the default's says no), its tensors copied as they are:
    ``bench quality`` compares it with llama.cpp, which adds the BOS where a file asks."""
    import gguf

    dst = models_dir() / f"{DEFAULT_NAME}.add-bos.gguf"
    if dst.is_file():
        return dst
    gf = GGUFFile(default_model_path())
    fields = {
        **source_fields(gf.path),
        **_file_type(gf.metadata["general.file_type"]),
        "tokenizer.ggml.add_bos_token": (True, gguf.GGUFValueType.BOOL, None),
    }

    def blocks(name: str) -> Callable[[], np.ndarray]:
        return lambda: gf.blocks(name).numpy()

    tensors: list[Tensor] = [
        (name, info.shape, gguf.GGMLQuantizationType(info.type_id), blocks(name))
        for name, info in gf.tensors.items()
    ]
    return write_gguf(dst, gf.metadata["general.architecture"], fields, tensors)


NAMES_HELP = (
    "paths, or requant (the default model and its re-quantizations by llama.cpp: "
    + ", ".join(LLAMACPP_TYPES)
    + "), or qwen05 / gemma270 (Qwen2.5-0.5B's / Gemma 3 270M's sizes, the default model's "
    "weights tiled into them, as llama.cpp's Q4_K_M), or bos (the default model with a "
    "tokenizer that adds a BOS); made on first use"
)


def named_files(value: str) -> list[Path]:
    """The GGUF files a bench's ``--files`` names (comma-separated; :data:`NAMES_HELP`)."""
    out: list[Path] = []
    for part in (p.strip() for p in value.split(",") if p.strip()):
        if part == "requant":
            out += [default_model_path(), *map(llamacpp_quantized, LLAMACPP_TYPES)]
        elif part in SHAPES:
            out.append(shaped(part))
        elif part == "bos":
            out.append(with_bos())
        else:
            out.append(Path(part).expanduser())
    return out
