"""Weight formats of the model's matmuls: fp32, bf16, int8 (per row) and int4 (groups of 32, with
the lm_head in int8: the default GGUF's own Q4_1 layers, their blocks kept as they are, and its
Q8_0 output re-encoded).

A checkpoint's state (HF names) is first fused into the model's own layout (:func:`fuse_state`:
one QKV and one gate+up matrix per layer), then each matmul weight is stored in the chosen format
(:func:`pack_state`). The packed state is a flat ``dict[str, Tensor]`` that safetensors can cache
and that :func:`make_linear` turns back into callables, so a cached start reads it as it is.

Every format has a torch path (bf16 ``F.linear``, ``aten._weight_int8pack_mm``,
``aten._weight_int4pack_mm_for_cpu``, fp32 ``F.linear``); with the native kernels loaded
(``chatpage.engine.model.ops``) a matmul of at most ``GEMV_ROWS[format]`` rows runs through the
GEMVs of ``csrc/cpu/gemv.cpp`` (reference: ``engine/model/gemv.py``) and one of at least
``GEMM_ROWS[format]`` rows through the GEMMs (``csrc/cpu/gemm.cpp``, the q8 GEMMs of
``csrc/cpu/gemm_q8.cpp`` where VNNI has them). The cut-overs are per vector ISA
(``ops.vector_isa()``) and come from the measurements in docs/kernels.md ("Matmuls").

The quantized torch paths take bf16 activations (with fp32 ones they are 10-20x slower), so a
quantized model's matmul inputs are bf16 while the residual stream, norms, RoPE, attention and
the KV cache keep the engine dtype; the GEMVs take either.

int4 is stored in the GEMV's layout, whose nibbles line up with consecutive activations and which
the GEMM reads too; :func:`make_linear` derives what a machine runs from it at load: torch's
int4pack by torch's own conversion (with AMX for 3-4 rows; everything without the native kernels)
or a q8 pack (:func:`q8_packs`), so the packed cache holds the nibbles once (a GGUF's pack stays near the
file's size). Only the GEMV's layout counts in :func:`step_bytes` (a q8 pack has the same bytes).
A matrix with a table of 16 levels of its own (``<name>.levels``: a GGUF's IQ4_NL / IQ4_XS) has no
torch int4pack form: it runs through the native kernels only (the GEMV up to the GEMM's rows),
dequantized where they are not loaded or on CUDA.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from chatpage.engine.config import check_format
from chatpage.engine.device import has_cuda_kernel
from chatpage.engine.model import gemv, ops
from chatpage.engine.model.gemv import INT4_GROUP, torch_int4pack
from chatpage.engine.model.model_config import ModelShape
from chatpage.vocab import WEIGHT_FORMATS

# Bumped whenever a format's stored tensors change (the packed cache's file names carry it, so
# an older cache is packed again, never misread). 2: int4 stores the native GEMV's layout too.
# 3: no dense fp32 embedding table in the quantized formats (bf16 rows, or int8 rows: the tied
# lm_head's own). 4: a GGUF's Q4_0 / Q4_1 matrices keep their own blocks in int4
# (TensorSource.load_int4). 5: IQ4_NL / IQ4_XS matrices too, as int4 with their table of levels
# (``.levels``), no longer int8 rows.
PACKED_LAYOUT = 5

# The model's matmuls per layer (fused) and the lm_head, in the packed state's names.
LAYER_LINEARS = ("qkv", "o", "gate_up", "down")

# Up to this many rows, fp32 CPU matmuls run as W @ x.T (one row padded to two): MKL's paths for
# x @ W.T with 1-3 rows (a GEMV, or a slow small-M GEMM) read the weights at about half the speed.
# Measured on the default model, 1 thread: the step's matmuls at 1 row 45 -> 29 ms, 2 rows
# 79 -> 28 ms, 4 rows 63 -> 46 ms; from about 8 rows on, x @ W.T is as fast or faster.
SMALL_BATCH_ROWS = 4

# With the native kernels loaded, matmuls of up to GEMV_ROWS[format] rows run through the GEMVs
# of csrc/cpu/gemv.cpp, of at least GEMM_ROWS[format] rows through the tiled GEMMs of
# csrc/cpu/gemm.cpp (the weights decoded once per call, fp32 FMAs), between the two cut-overs
# through torch's path; fp32 keeps MKL's sgemm past its GEMV. Measured on the default model's
# shapes, 1 thread, per vector ISA of the build (ops.vector_isa(); see the module docstring):
# with AVX2 torch's paths win nowhere and the GEMVs (4 x 2 tiles) run up to 16 rows (int4: a q8 pack
# at every row count, Q8_FORMATS); with AMX the GEMMs' tiles win from 5
# rows (int4: torch's int4pack between), 9 (int8) or 5 (bf16). With AVX-512 but no AMX (Zen 4)
# int4 and int8 matrices are q8 packs (q8_packs: one kernel for every row count); one of another
# size takes the GEMV up to 4 (int8: 5) rows and the q8 GEMM (csrc/cpu/gemm_q8.cpp: int8
# activations, VNNI dot products) beyond; torch's quantized kernels nowhere.
_CUT_OVERS = {
    "amx": (
        {"fp32": 16, "bf16": 4, "int8": 8, "int4": 2},
        {"bf16": 5, "int8": 9, "int4": 5},
    ),
    "avx512": (
        {"fp32": 16, "bf16": 4, "int8": 5, "int4": 4},
        {"bf16": 5, "int8": 6, "int4": 5},
    ),
    "avx2": (
        {"fp32": 16, "bf16": 8, "int8": 16, "int4": 16},
        {"bf16": 9, "int8": 17, "int4": 17},
    ),
}
_ISA = ops.vector_isa()  # (it reads /proc/cpuinfo: once, not per matrix)
GEMV_ROWS, GEMM_ROWS = _CUT_OVERS.get(_ISA, _CUT_OVERS["avx2"])


def gemm_kernel(fmt: str) -> str:
    """The name of the native GEMM that runs ``fmt``'s matmuls from ``GEMM_ROWS[fmt]`` rows on
    (the kernels loaded): the q8 GEMMs for int4 and int8 on an AVX-512 CPU without AMX (when the
    build has them: ``gemm_q8()``), else ``gemm_<fmt>`` (csrc/cpu/gemm.cpp)."""
    q8 = _ISA == "avx512" and fmt in ("int4", "int8")
    return f"gemm_q8_{fmt}" if q8 and torch.ops.chatpage.gemm_q8() else f"gemm_{fmt}"


class Gemv:
    """One matmul's native kernel with its weight tensors bound: ``op(x, *args, bias)``; a GEMV
    (``csrc/cpu/gemv.cpp``) for inputs of at most ``rows`` rows, a GEMM (``csrc/cpu/gemm.cpp``)
    for inputs of at least ``rows`` rows. ``args`` may hold None (int4 without levels of its
    own); ``parts``, the tensors among them, are what the native decode loop
    (``torch.ops.chatpage.decode_layers``) takes."""

    __slots__ = ("op", "args", "parts", "bias", "rows")

    def __init__(
        self,
        op: Callable[..., torch.Tensor],
        args: tuple[torch.Tensor | None, ...],
        bias: torch.Tensor | None,
        rows: int,
    ) -> None:
        # op: a kernel, op(x, *args, bias) -> the product (torch.ops' functions are untyped)
        self.op, self.args, self.bias, self.rows = op, args, bias, rows
        self.parts = tuple(t for t in args if t is not None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, *self.args, self.bias)


class Linear:
    """One matmul of the model in its stored format: ``linear(x [T, K]) -> [T, N]``; ``gemv`` is
    its native few-row path, when it has one, ``gemm`` its native GEMM when that takes every row
    count past the GEMV's (no torch path between)."""

    __slots__ = ("forward", "in_features", "gemv", "gemm")

    def __init__(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        in_features: int,
        gemv: Gemv | None = None,
        gemm: Gemv | None = None,
    ) -> None:
        self.forward = forward
        self.in_features = in_features
        self.gemv = gemv
        self.gemm = (
            gemm if gemv is not None and gemm is not None and gemm.rows == gemv.rows + 1 else None
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)


def matmul_dtype(weights: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype of the activations fed to the matmuls: bf16 for every format but fp32."""
    return dtype if weights == "fp32" else torch.bfloat16


class TensorSource(Protocol):
    """Where a checkpoint's tensors come from, one at a time, by their HF names: a GGUF file
    (``engine/load/gguf_model.py``), a safetensors folder, or a dict of tensors already in memory."""

    def __contains__(self, name: object) -> bool: ...

    def load(self, name: str) -> torch.Tensor: ...

    def load_fused(self, names: tuple[str, ...]) -> torch.Tensor:
        """The tensors ``names`` concatenated along their first dimension (one matrix of the
        model's own layout: QKV, gate+up)."""
        ...

    def load_int4(
        self, names: tuple[str, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The matrices ``names`` concatenated along their rows as int4 (q4, scales, zeros:
        :func:`pack_int4`'s tensors, and their table of 16 levels or None: ``engine/model/gemv.py``)
        from the checkpoint's own 4-bit groups, when it stores every one of them in a form int4
        holds exactly (a GGUF's Q4_0, Q4_1, IQ4_NL, IQ4_XS); else None."""
        ...

    def row_chunks(self, name: str, rows: int) -> tuple[int, Iterator[torch.Tensor]] | None:
        """Tensor ``name``'s row count and its fp32 rows, ``rows`` at a time, where the source
        can read it so (a GGUF's embedding and lm_head: never whole in fp32); else None. A chunk
        may be overwritten by the next one: use it before reading on."""
        ...


class StateSource:
    """A :class:`TensorSource` over a dict of HF-named tensors (each handed out once)."""

    def __init__(self, state: MutableMapping[str, torch.Tensor]) -> None:
        self.state = state

    def __contains__(self, name: object) -> bool:
        return name in self.state

    def load(self, name: str) -> torch.Tensor:
        return self.state.pop(name)

    def load_fused(self, names: tuple[str, ...]) -> torch.Tensor:
        return self.load(names[0]) if len(names) == 1 else torch.cat([self.load(n) for n in names])

    def load_int4(self, names: tuple[str, ...]) -> None:
        """None: dense tensors have no 4-bit groups of their own."""
        return None

    def row_chunks(self, name: str, rows: int) -> None:
        """None: the tensors are in memory already, whole."""
        return None


def fused_layout(config: Any, source: TensorSource) -> list[tuple[str, tuple[str, ...]]]:
    """Every tensor of the model's own layout with the HF tensors it is made of, in order: one
    QKV (Qwen2's bias too) and one gate+up matrix per layer, concatenated along the outputs (or
    as the checkpoint fuses them already: Phi-3), and the norms a layer has: q/k norms (Qwen3,
    Gemma 3) and Gemma's four (``post_norm`` is then the pre-MLP one)."""
    out: list[tuple[str, tuple[str, ...]]] = [
        ("embed.weight", ("model.embed_tokens.weight",)),
        ("norm", ("model.norm.weight",)),
    ]
    if "lm_head.weight" in source:
        out.append(("lm_head.weight", ("lm_head.weight",)))
    for i in range(config.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        if p + "self_attn.q_proj.weight" in source:
            out.append((q + "qkv.weight", tuple(p + f"self_attn.{x}_proj.weight" for x in "qkv")))
        else:
            out.append((q + "qkv.weight", (p + "self_attn.qkv_proj.weight",)))
        if p + "self_attn.q_proj.bias" in source:
            out.append((q + "qkv.bias", tuple(p + f"self_attn.{x}_proj.bias" for x in "qkv")))
        if p + "mlp.gate_proj.weight" in source:
            gate_up: tuple[str, ...] = (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight")
        else:
            gate_up = (p + "mlp.gate_up_proj.weight",)
        out += [
            (q + "o.weight", (p + "self_attn.o_proj.weight",)),
            (q + "gate_up.weight", gate_up),
            (q + "down.weight", (p + "mlp.down_proj.weight",)),
            (q + "input_norm", (p + "input_layernorm.weight",)),
        ]
        norms = [("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm")]
        if p + "pre_feedforward_layernorm.weight" in source:
            norms += [
                ("attn_out_norm", "post_attention_layernorm"),
                ("post_norm", "pre_feedforward_layernorm"),
                ("mlp_out_norm", "post_feedforward_layernorm"),
            ]
        else:
            norms.append(("post_norm", "post_attention_layernorm"))
        out += [
            (q + ours, (p + hf + ".weight",)) for ours, hf in norms if p + hf + ".weight" in source
        ]
    return out


def read_state(config: Any, source: TensorSource) -> dict[str, torch.Tensor]:
    """Every tensor of ``source`` the model uses, by HF name."""
    return {n: source.load(n) for _, parts in fused_layout(config, source) for n in parts}


def fuse_state(config: Any, state: MutableMapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF-named fp32 tensors -> the model's names (``layers.{i}.qkv.weight``, ...), consuming
    ``state`` (a dict, or a checkpoint streamed tensor by tensor: ``engine/load/stream.py``;
    :func:`fused_layout`), on the tensors' device."""
    source = StateSource(state)
    return {name: source.load_fused(parts) for name, parts in fused_layout(config, source)}


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (qweight [N, K] int8, scales [N] bf16), w ~= q * scale."""
    scale = (w.abs().amax(dim=1).float() / 127).clamp(min=1e-12).to(torch.bfloat16)
    q = torch.round(w.float() / scale.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(
    w: torch.Tensor, group: int = INT4_GROUP
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 in groups of ``group`` inputs: (levels [N, K] int32 in 0..15,
    scales [N, K/group] bf16, zeros [N, K/group] bf16) with w ~= (q - 8) * scale + zero.

    The scale and zero are rounded to bf16 before q is chosen, so the rounding of the stored scale
    does not add to the error (a GGUF Q4_1 block comes back exactly when its values span the 16
    levels).
    """
    n, k = w.shape
    if k % group:
        raise ValueError(f"int4 weights need input sizes divisible by {group}, got {k}")
    wg = w.float().view(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-8).to(torch.bfloat16)
    zero = (lo + 8 * scale.float()).to(torch.bfloat16)
    base = zero.float() - 8 * scale.float()
    q = torch.round((wg - base[..., None]) / scale.float()[..., None]).clamp(0, 15)
    return q.to(torch.int32).view(n, k), scale, zero


def _native_quantize(w: torch.Tensor) -> bool:
    """Whether ``w`` is quantized by the native kernels (``csrc/cpu/quantize.cpp``: one pass,
    the same bytes as :func:`quantize_int8` and :func:`quantize_int4` + ``gemv.pack_int4``)."""
    return w.dtype == torch.float32 and w.device.type == "cpu" and ops.available(w.device)


def int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_int8` of ``w``, natively where it can be."""
    if not _native_quantize(w):
        return quantize_int8(w)
    q = torch.empty(w.shape, dtype=torch.int8)
    s = torch.empty(w.shape[0], dtype=torch.bfloat16)
    torch.ops.chatpage.quantize_int8(w.contiguous(), q, s)
    return q, s


def int4_packed(w: torch.Tensor, name: str) -> dict[str, torch.Tensor]:
    """``w`` stored as int4 under ``name`` (:func:`quantize_int4` + :func:`pack_int4`), natively
    where it can be."""
    n, k = w.shape
    if not _native_quantize(w) or k % INT4_GROUP:
        return pack_int4(*quantize_int4(w), name)
    q4 = torch.empty(n, k // 2, dtype=torch.uint8)
    scales = torch.empty(n, k // INT4_GROUP, dtype=torch.bfloat16)
    zeros = torch.empty_like(scales)
    torch.ops.chatpage.quantize_int4(w.contiguous(), q4, scales, zeros)
    return {name + ".q4": q4, name + ".scales": scales, name + ".zeros": zeros}


def pack_int4(
    levels: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, name: str
) -> dict[str, torch.Tensor]:
    """One int4 matrix as stored: the native GEMV's layout (``.q4``, ``.scales``, ``.zeros``,
    :mod:`chatpage.engine.model.gemv`), which the GEMM reads too; :func:`make_linear` derives torch's
    int4pack from it (byte moves), so a pack holds the nibbles once."""
    return {name + ".q4": gemv.pack_int4(levels), name + ".scales": scales, name + ".zeros": zeros}


def pack_tensor(
    name: str, w: torch.Tensor, weights: str, tied: bool, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """One tensor of the model's own layout (``name``: ``layers.3.qkv.weight``, ``embed.weight``,
    ``norm``, ...) stored in ``weights``: the packed tensors it becomes. The seam every loading
    path packs through, one tensor at a time.

    Matmul weights take the format; the int4 format keeps the lm_head in int8 (in int4 it cost the
    default model 4.2% of perplexity, in int8 the whole format is within 0.1% of fp32: ``chatpage
    bench quality``). The embedding table is never kept dense in fp32 by a quantized format: bf16
    keeps it in bf16, int8 and int4 as int8 rows; with ``tied`` embeddings it is stored once, as
    the lm_head, and the lookups read those rows. fp32 keeps it in ``dtype`` (the tied lm_head
    reads it). Norms and biases keep ``dtype``.
    """
    prefix, _, kind = name.rpartition(".")
    if name == "embed.weight" and weights != "fp32":
        if tied:
            return pack_tensor("lm_head.weight", w, weights, tied, dtype)
        if weights == "bf16":
            return {name: w.to(torch.bfloat16).contiguous()}
        q, s = int8_rows(w)
        return {"embed.qweight": q, "embed.scales": s}
    if kind != "weight" or not (prefix == "lm_head" or prefix.rpartition(".")[2] in LAYER_LINEARS):
        return {name: w.to(dtype).contiguous()}
    if weights == "int8" or (weights == "int4" and prefix == "lm_head"):
        q, s = int8_rows(w)
        return {prefix + ".qweight": q, prefix + ".scales": s}
    if weights == "int4":
        return int4_packed(w, prefix)
    return {name: w.to(torch.bfloat16 if weights == "bf16" else dtype).contiguous()}


def pack_source(
    config: Any, source: TensorSource, weights: str, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The packed state of the checkpoint ``source`` in ``weights``, read and packed one fused
    tensor at a time (at most one of them unpacked in memory besides the packed state).

    int4 takes a GGUF's Q4_0 / Q4_1 / IQ4_NL / IQ4_XS matrices as they are
    (:meth:`TensorSource.load_int4`; the IQ4 ones with their table of levels: re-quantized to
    int4's even levels, llama.cpp's IQ4_NL copy of the default model lost 40% of perplexity
    against llama.cpp on the same file)."""
    check_format(weights)
    tied = "lm_head.weight" not in source
    out: dict[str, torch.Tensor] = {}
    for name, parts in fused_layout(config, source):
        kept = _own_int4(source, name, parts) if weights == "int4" else None
        if kept is None and weights != "fp32" and name in ROW_TABLES and len(parts) == 1:
            kept = _pack_rows(name, source, parts[0], weights, tied, dtype)
        out.update(kept or pack_tensor(name, source.load_fused(parts), weights, tied, dtype))
        _trim_heap()
    out["format." + weights] = torch.zeros(0)
    return out


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None where the C library has none (musl, macOS)."""
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def _trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's ``malloc_trim``).

    Packing frees an fp32 copy of each tensor between the packed ones it keeps; glibc keeps such
    holes (and the free top of the heap, below its raised trim threshold) resident, so without
    this the Gemma-3-270M-shaped Q4_K_M's first load peaked at 851 MB of RSS instead of 670 (a
    trim after each of its ~250 tensors costs ~70 ms in all)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


ROW_TABLES = ("embed.weight", "lm_head.weight")
"""The tables every quantized format stores row by row (bf16 rows, int8 rows)."""
ROW_CHUNK = 8192
"""Rows of a table converted at a time: a chunk of a 262,144-row vocabulary's fp32 rows (Gemma 3)
is 3% of the whole 0.7 GB."""


def _pack_rows(
    name: str,
    source: TensorSource,
    part: str,
    weights: str,
    tied: bool,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor] | None:
    """:func:`pack_tensor` of the table ``name`` (a `ROW_TABLES` one, not fp32) a chunk of rows
    at a time, into its packed tensors made once: its fp32 rows are never whole in memory.
    None where ``source`` reads the table only whole."""
    table = source.row_chunks(part, ROW_CHUNK)
    if table is None:
        return None
    rows, chunks = table
    out: dict[str, torch.Tensor] = {}
    at = 0
    for chunk in chunks:
        for key, packed in pack_tensor(name, chunk, weights, tied, dtype).items():
            if key not in out:  # the first chunk tells each packed tensor's type and row width
                out[key] = torch.empty(rows, *packed.shape[1:], dtype=packed.dtype)
            out[key][at : at + len(packed)] = packed
        at += len(chunk)
    return out


def _own_int4(
    source: TensorSource, name: str, parts: tuple[str, ...]
) -> dict[str, torch.Tensor] | None:
    """A layer's matmul weight ``name`` as int4 from the checkpoint's own 4-bit groups
    (:meth:`TensorSource.load_int4`), where it has them; None for every other tensor (the
    lm_head and the embedding stay int8 rows: :func:`pack_tensor`)."""
    prefix, _, kind = name.rpartition(".")
    if kind != "weight" or prefix.rpartition(".")[2] not in LAYER_LINEARS:
        return None
    own = source.load_int4(parts)
    if own is None:
        return None
    names = (prefix + x for x in (".q4", ".scales", ".zeros", ".levels"))
    return {n: t for n, t in zip(names, own, strict=True) if t is not None}


def pack_state(
    config: Any, fused: dict[str, torch.Tensor], weights: str, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Store every tensor of a fused state in ``weights`` (consumes ``fused``;
    :func:`pack_tensor`)."""
    check_format(weights)
    tied = "lm_head.weight" not in fused
    out: dict[str, torch.Tensor] = {}
    for name in list(fused):
        out.update(pack_tensor(name, fused.pop(name), weights, tied, dtype))
    out["format." + weights] = torch.zeros(0)
    return out


def state_format(packed: Mapping[str, torch.Tensor]) -> str | None:
    """The format a packed state is stored in; None for a state that is not packed."""
    found = [f for f in WEIGHT_FORMATS if "format." + f in packed]
    return found[0] if found else None


# Up to this many rows a q8 pack runs a matmul on an AMX CPU, the AMX GEMM beyond (the 30 layers'
# int4 matmuls of the default model, 2 threads, ms at 1 / 4 / 8 / 16 / 32 / 64 rows: q8 pack
# 2.2 / 2.4 / 3.5 / 5.9 / 11.0 / 20.3, AMX GEMM 8.5 / 7.9 / 7.9 / 8.4 / 11.1 / 16.0, the GEMV
# 4-5 / 8.8 / 16.5 / 32 / 63). One kernel for every step of up to this many rows also computes
# each row alike whatever the others (row invariance: what exact speculative decoding needs,
# ``engine/core/speculate.py``). On a CPU without AMX a pack takes every row count.
Q8_PACK_ROWS = 32 if _ISA == "amx" else sys.maxsize

# The same for int8 matrices, whose pack runs two passes over the activations (the second
# quantizing what the first left over), so that the AMX GEMM (int8 levels exact in bf16, fp32
# sums scaled per row) is faster from about 12 rows on (2 threads, ms at 8 / 16 / 24 / 32 rows:
# the default model's 30 int8 layers, pack 10.7 / 16.2 / 19.3 / 20.7 against the GEMM 11.6 /
# 11.7 / 13.6 / 13.6; its int8 lm_head 1.24 / 1.99 / 2.97 / 3.63 against 1.33 / 1.33 / 1.89 /
# 2.11; a Qwen2.5-0.5B-shaped lm_head of 151,936 rows 10.3 / 17.0 / 21.5 / 23.5 against 13.0 /
# 13.5 / 15.3 / 14.8). 16: a step of one sequence and 15 drafted tokens stays within one kernel.
Q8_INT8_PACK_ROWS = 16 if _ISA == "amx" else sys.maxsize

# The formats whose matrices run as q8 packs, per vector ISA (csrc/cpu/gemm_q8.cpp): with AVX-512
# VNNI int4 and int8; with AVX2 int4 alone, whose packed q8 GEMM (maddubs) is the fastest kernel
# there at every row count, while int8's, with its two passes over the activations and the sign
# trick, is slower than the GEMV and the fp32-FMA GEMM (docs/kernels.md, "Matmuls").
Q8_FORMATS = {"amx": ("int4", "int8"), "avx512": ("int4", "int8"), "avx2": ("int4",)}


def q8_packs(rows: int, fmt: str) -> bool:
    """Whether a ``fmt`` (int8 or int4) matrix of ``rows`` output rows runs as a q8 pack (the
    kernels loaded): where :data:`Q8_FORMATS` says so for this CPU and its build has the q8 GEMMs
    (with AMX up to :func:`q8_pack_rows` rows), for a matrix of whole 32-row tasks
    (``csrc/cpu/gemm_q8.cpp``)."""
    return fmt in Q8_FORMATS.get(_ISA, ()) and rows % 32 == 0 and torch.ops.chatpage.gemm_q8()


def q8_pack_rows(fmt: str) -> int:
    """The most rows a ``fmt`` (int8 or int4) q8 pack runs a matmul of (the AMX GEMM beyond)."""
    return Q8_INT8_PACK_ROWS if fmt == "int8" else Q8_PACK_ROWS


def _packed(
    op: Callable[..., torch.Tensor],
    args: tuple[torch.Tensor | None, ...],
    bias: torch.Tensor | None,
    k: int,
    rows: int,
    many: Callable[..., torch.Tensor],
    many_args: tuple[torch.Tensor | None, ...],
) -> Linear:
    """The :class:`Linear` of a q8 pack: one kernel for every row count up to ``rows``
    (`Q8_PACK_ROWS`, `Q8_INT8_PACK_ROWS`: its ``gemv``), ``many`` (the AMX GEMM) beyond."""
    kernel = Gemv(op, args, bias, rows)
    if rows == sys.maxsize:
        return Linear(kernel, k, kernel)
    beyond = Gemv(many, many_args, bias, rows + 1)
    return Linear(_by_rows(kernel, beyond, beyond), k, kernel, beyond)


def make_linear(
    packed: dict[str, torch.Tensor],
    name: str,
    device: torch.device,
    half: torch.dtype | None = None,
) -> Linear:
    """The :class:`Linear` ``x [T, K] -> x @ W.T (+ bias)`` of the packed weight ``name``
    (on CUDA: :func:`cuda_linear`, dense weights in ``half`` when given)."""
    if device.type == "cuda":
        return cuda_linear(packed, name, device, half)
    bias = packed.get(name + ".bias")
    if bias is not None:
        bias = bias.to(device)
    native = device.type == "cpu" and ops.available(device)
    lib = torch.ops.chatpage
    fn: Callable[[torch.Tensor], torch.Tensor]  # the quantized product, for many rows
    if name + ".qweight" in packed:
        q, s = (
            _aligned(packed[name + ".qweight"], device),
            _aligned(packed[name + ".scales"], device),
        )
        fn = lambda x: torch.ops.aten._weight_int8pack_mm(x, q, s)  # noqa: E731
        k = q.shape[1]
        if native and q8_packs(q.shape[0], "int8"):
            pack = (lib.q8_pack_int8(q), s)
            return _packed(
                lib.gemm_q8_int8_packed, pack, bias, k, q8_pack_rows("int8"), lib.gemm_int8, (q, s)
            )
        if native:
            gemv = Gemv(lib.gemv_int8, (q, s), bias, GEMV_ROWS["int8"])
            gemm = Gemv(getattr(lib, gemm_kernel("int8")), (q, s), bias, GEMM_ROWS["int8"])
            if gemm.rows <= gemv.rows + 1:  # no row count reaches torch's kernel
                return Linear(_by_rows(gemv, gemm, gemm), k, gemv, gemm)
    elif name + ".q4" in packed:
        q4, scales, zeros = (packed[name + x] for x in (".q4", ".scales", ".zeros"))
        levels = packed.get(name + ".levels")
        k = q4.shape[1] * 2
        if levels is not None and not native:  # torch's int4pack has no table of levels
            return _dequantized_int4(packed, name, device, bias)
        if native:  # the GEMV's own layout, which the GEMM reads too
            args = tuple(None if t is None else t.to(device) for t in (q4, scales, zeros, levels))
            if q8_packs(q4.shape[0], "int4"):
                pack = lib.q8_pack_int4(q4, scales, zeros)
                return _packed(
                    lib.gemm_q8_int4_packed,
                    (pack, levels),
                    bias,
                    k,
                    q8_pack_rows("int4"),
                    lib.gemm_int4,
                    args,
                )
            # with levels torch's kernel cannot run it: the GEMV takes every row below the GEMM's
            few = GEMV_ROWS["int4"] if levels is None else GEMM_ROWS["int4"] - 1
            gemv = Gemv(lib.gemv_int4, args, bias, few)
            gemm = Gemv(getattr(lib, gemm_kernel("int4")), args, bias, GEMM_ROWS["int4"])
            if gemm.rows <= gemv.rows + 1:  # no row count reaches torch's kernel: no copy for it
                return Linear(_by_rows(gemv, gemm, gemm), k, gemv, gemm)
        p = _aligned(torch_int4pack(q4), device)  # torch's layout, [K/32, N, 2] scales
        sz = _aligned(torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous(), device)
        fn = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, p, INT4_GROUP, sz)  # noqa: E731
    else:
        w = packed[name + ".weight"].to(device).contiguous()
        bias = None if bias is None else bias.to(w.dtype)
        k = w.shape[1]
        plain = lambda x: F.linear(x, w, bias)  # noqa: E731
        if device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16):
            return Linear(plain, k)
        fp32 = w.dtype == torch.float32
        if not native:
            return Linear(
                (lambda x: _small_batch_linear(x, w, bias, SMALL_BATCH_ROWS)) if fp32 else plain, k
            )
        if fp32:
            gemv = Gemv(lib.gemv_fp32, (w,), bias, GEMV_ROWS["fp32"])
            return Linear(_by_rows(gemv, plain), k, gemv)
        gemv = Gemv(lib.gemv_bf16, (w,), bias, GEMV_ROWS["bf16"])
        gemm = Gemv(lib.gemm_bf16, (w,), bias, GEMM_ROWS["bf16"])
        return Linear(_by_rows(gemv, plain, gemm), k, gemv, gemm)
    many = fn if bias is None else (lambda x: fn(x) + bias)
    if not native:
        return Linear(many, k)
    return Linear(_by_rows(gemv, many, gemm), k, gemv, gemm)


def _dequantized_int4(
    packed: dict[str, torch.Tensor], name: str, device: torch.device, bias: torch.Tensor | None
) -> Linear:
    """The int4 matrix ``name`` dequantized (``gemv.dequantize_int4``: fp32 on the CPU, bf16 on
    CUDA) behind ``F.linear``: a matrix with levels of its own where no kernel takes them."""
    q4, scales, zeros = (packed[name + x].to(device) for x in (".q4", ".scales", ".zeros"))
    levels = packed.get(name + ".levels")
    w32 = gemv.dequantize_int4(q4, scales, zeros, None if levels is None else levels.to(device))
    w = w32 if device.type == "cpu" else w32.to(torch.bfloat16)
    b = None if bias is None else bias.to(device, w.dtype)
    return Linear(lambda x: F.linear(x.to(w.dtype), w, b).to(x.dtype), w.shape[1])


class Embedding:
    """The token embedding lookup of a packed state: ``embedding(ids [T]) -> [T, H]`` in the
    engine dtype, from a dense table, or from int8 rows and their scales (:func:`pack_tensor`)."""

    __slots__ = ("lookup", "num_embeddings")

    def __init__(
        self, packed: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype
    ) -> None:
        name = next(
            n for n in ("embed", "lm_head") if n + ".weight" in packed or n + ".qweight" in packed
        )
        if name + ".qweight" in packed:
            q, s = packed[name + ".qweight"].to(device), packed[name + ".scales"].to(device)
            self.lookup: Callable[[torch.Tensor], torch.Tensor] = lambda ids: (
                q.index_select(0, ids).to(dtype) * s.index_select(0, ids).to(dtype)[:, None]
            )
        else:
            w = packed[name + ".weight"].to(device)
            w = w.to(dtype).contiguous() if w.dtype == torch.float32 else w.contiguous()
            self.lookup = lambda ids: F.embedding(ids, w).to(dtype)
        self.num_embeddings = packed[
            name + (".qweight" if name + ".qweight" in packed else ".weight")
        ].shape[0]

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(ids)


def int4pack_inner_tiles(k: int) -> int:
    """The ``innerKTiles`` of torch's CUDA int4 layout for ``k`` inputs: the most of 8, 4, 2 whose
    tile (16 inputs each) divides ``k``; ValueError when none does."""
    for tiles in (8, 4, 2):
        if k % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"torch's CUDA int4 matmul needs input sizes divisible by 32, got {k}")


def cuda_linear(
    packed: dict[str, torch.Tensor], name: str, device: torch.device, half: torch.dtype | None
) -> Linear:
    """A matmul on a GPU through torch's CUDA paths: int8 ``_weight_int8pack_mm`` (dequantized
    to ``half`` where this torch has no CUDA kernel for it: the int8 lm_head of int4), int4
    ``_weight_int4pack_mm`` (the levels repacked on the GPU into its tiled layout; the same
    scales and zeros as the CPU's: w = (q - 8) * scale + zero; one with levels of its own
    dequantized to bf16 behind ``F.linear``), dense ``F.linear`` (cuBLAS) with the weights in
    ``half`` (or as stored). Inputs: bf16 for the quantized ones."""
    bias = packed.get(name + ".bias")
    aten = torch.ops.aten
    if name + ".qweight" in packed and not has_cuda_kernel("aten::_weight_int8pack_mm"):
        # int4's lm_head is int8: without torch's CUDA int8 kernel it runs dequantized
        q = packed[name + ".qweight"].to(device)
        w = (q.float() * packed[name + ".scales"].to(device).float()[:, None]).to(
            half or torch.bfloat16
        )
        b = None if bias is None else bias.to(device, w.dtype)
        return Linear(lambda x: F.linear(x, w, b), w.shape[1])
    if name + ".qweight" in packed:
        q = packed[name + ".qweight"].to(device).contiguous()
        s = packed[name + ".scales"].to(device).contiguous()
        fn: Callable[[torch.Tensor], torch.Tensor] = lambda x: aten._weight_int8pack_mm(x, q, s)  # noqa: E731
        k = q.shape[1]
    elif name + ".levels" in packed:  # torch's CUDA int4 matmul has no table of levels
        return _dequantized_int4(packed, name, device, bias)
    elif name + ".q4" in packed:
        levels = gemv.unpack_int4(packed[name + ".q4"].to(device))
        k = levels.shape[1]
        pairs = (levels[:, ::2] << 4 | levels[:, 1::2]).to(torch.uint8).contiguous()
        p = aten._convert_weight_to_int4pack(pairs, int4pack_inner_tiles(k))
        sz = (
            torch.stack([packed[name + ".scales"], packed[name + ".zeros"]], dim=-1)
            .transpose(0, 1)
            .to(device, torch.bfloat16)
            .contiguous()
        )  # [K/32, N, 2]
        fn = lambda x: aten._weight_int4pack_mm(x, p, INT4_GROUP, sz)  # noqa: E731
    else:
        w = packed[name + ".weight"]
        w = w.to(device, half or w.dtype).contiguous()
        b = None if bias is None else bias.to(device, w.dtype)
        return Linear(lambda x: F.linear(x, w, b), w.shape[1])
    if bias is None:
        return Linear(fn, k)
    b = bias.to(device, torch.bfloat16)
    return Linear(lambda x: fn(x) + b, k)


def _by_rows(
    few: Gemv, middle: Callable[[torch.Tensor], torch.Tensor], many: Gemv | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The kernel for a step's rows: ``few`` for at most ``few.rows``, ``many`` (a GEMM) from
    ``many.rows`` on, ``middle`` (torch's path) between."""
    rows = few.rows
    if many is None:
        return lambda x: few(x) if x.shape[0] <= rows else middle(x)
    from_rows = many.rows
    return lambda x: (
        few(x) if x.shape[0] <= rows else many(x) if x.shape[0] >= from_rows else middle(x)
    )


def _aligned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` at a 64-byte aligned address: tensors read from a safetensors file can
    start anywhere, and torch's int8 kernel segfaults on a misaligned weight from 4 rows on."""
    t = t.to(device)
    return t if t.data_ptr() % 64 == 0 else t.clone()


def _small_batch_linear(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, small: int
) -> torch.Tensor:
    """``F.linear(x, w, bias)``, through W @ x.T for the few rows of a small batch."""
    n = x.shape[0]
    if not 0 < n <= small:
        return F.linear(x, w, bias)
    rows = torch.cat([x, x]) if n == 1 else x
    y = torch.mm(w, rows.t())[:, :n].t()
    if bias is not None:
        y = y + bias
    return y.contiguous()


# how matrix weights are stored, by the suffix of their packed tensors (int4's own levels first)
_STORED = ((".levels", "int4+levels"), (".q4", "int4"), (".qweight", "int8"))


def matrix_formats(packed: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Bytes of a packed state's matmul weights (the layers' and the lm_head) by how each is
    stored: ``int4+levels`` (int4 with a table of levels of its own), ``int4``, ``int8``, or a
    dense one's dtype (``bf16``, ``fp32``); largest first."""
    found: dict[str, str] = {}  # matrix -> how it is stored
    for key, t in packed.items():
        prefix, _, kind = key.rpartition(".")
        if not (prefix == "lm_head" or prefix.rpartition(".")[2] in LAYER_LINEARS):
            continue
        how = next((f for end, f in _STORED if key.endswith(end)), None)
        if how is None and kind == "weight":
            how = {torch.bfloat16: "bf16", torch.float32: "fp32"}.get(t.dtype, str(t.dtype))
        if how is not None and (prefix not in found or how == "int4+levels"):
            found[prefix] = how
    out: dict[str, int] = {}
    for key, t in packed.items():
        prefix = key.rpartition(".")[0]
        if prefix in found and not key.endswith(".bias"):
            out[found[prefix]] = out.get(found[prefix], 0) + t.numel() * t.element_size()
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def packed_bytes(packed: dict[str, torch.Tensor]) -> int:
    """Bytes of every tensor in a packed state."""
    return sum(t.numel() * t.element_size() for t in packed.values())


def step_bytes(config: ModelShape, packed: dict[str, torch.Tensor]) -> int:
    """Bytes one decode step reads from a packed state: every matmul weight (the lm_head, tied or
    not), the norms and biases; the embedding table counts only when it is the lm_head."""
    tied = not any(k.startswith("lm_head.") for k in packed)
    skip = () if tied else ("embed.",)
    return sum(
        t.numel() * t.element_size()
        for k, t in packed.items()
        if not k.startswith(skip) and not k.startswith("format.")
    )
