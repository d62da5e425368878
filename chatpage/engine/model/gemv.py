"""The few-row matmuls of the decode step: the int4 weight layout and the torch references of the
native kernels ``torch.ops.chatpage.gemv_fp32/bf16/int8/int4`` (``csrc/cpu/gemv.cpp``).

Each reference is the specification its kernel is tested against (tests/kernels/test_gemv.py): the kernel
sums in another order, nothing else differs. Every one computes ``x [M, K] @ W.T (+ bias)`` in
fp32 and returns ``x``'s dtype.

The int4 layout (``pack_int4``): q [N, K/2] uint8 where, inside each group of 32 inputs, byte j
holds input j in its low nibble and input j + 16 in its high nibble, so each half of a group's
16 bytes lines up with 16 consecutive activations; scales and zeros [N, K/32] bf16, contiguous
per row; w = (q - 8) * scale + zero. A matrix may carry a table of its own 16 levels, ``levels``
int8 [16] (stored as ``<name>.levels``: a GGUF's IQ4_NL / IQ4_XS, ``engine/load/gguf_int4.py``); then
w = levels[q] * scale + zero. Without one the levels are q - 8 (:data:`UNIFORM_LEVELS`).
"""

from __future__ import annotations

import torch

INT4_GROUP = 32
_HALF = INT4_GROUP // 2
# the levels of an int4 matrix without a table of its own: q - 8
UNIFORM_LEVELS = torch.arange(-8, 8, dtype=torch.int8)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Levels ``q`` [N, K] (integers 0..15, K a multiple of 32) -> the kernel's [N, K/2] uint8."""
    n, k = q.shape
    g = q.to(torch.uint8).view(n, k // INT4_GROUP, 2, _HALF)
    return (g[:, :, 0] | (g[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_int4`: levels [N, K] uint8."""
    n, half = packed.shape
    g = packed.view(n, half // _HALF, 1, _HALF)
    return torch.cat([g & 15, g >> 4], dim=2).reshape(n, half * 2)


def torch_int4pack(q4: torch.Tensor) -> torch.Tensor:
    """The kernel's [N, K/2] nibbles (:func:`pack_int4`) in torch's CPU int4pack layout, the
    operand of ``_weight_int4pack_mm_for_cpu``, by torch's own conversion: its layout depends on
    the CPU (blocks of 32 rows pairing rows i and i + 16 on an AVX-512 EPYC, pairs of neighbouring
    rows where AMX runs it), and the conversion takes ~1 ms for the default model's largest
    matrix."""
    levels = unpack_int4(q4).to(torch.int32)
    packed: torch.Tensor = torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels, 1)
    return packed


def dequantize_int4(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    levels: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 [N, K] weights of an int4 matrix in the kernel's layout (with its table of 16
    ``levels`` when given, else q - 8)."""
    table = (UNIFORM_LEVELS if levels is None else levels).to(q.device, torch.float32)
    w = table[unpack_int4(q).long()].view(q.shape[0], -1, INT4_GROUP)
    w = w * scales.float()[..., None] + zeros.float()[..., None]
    return w.view(q.shape[0], -1)


def _finish(y: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def reference_fp32(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight.T + bias`` for fp32 ``weight`` [N, K]."""
    return _finish(x.float() @ weight.t(), bias, x.dtype)


def reference_bf16(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ weight.T + bias`` for bf16 ``weight`` [N, K], widened to fp32 (exactly)."""
    return _finish(x.float() @ weight.float().t(), bias, x.dtype)


def reference_int8(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """``x @ (qweight * scales[:, None]).T + bias``: int8 [N, K] with one bf16 scale per row
    (the activations stay as given, fp32 or bf16)."""
    y = (x.float() @ qweight.float().t()) * scales.float()
    return _finish(y, bias, x.dtype)


def reference_int4(
    x: torch.Tensor,
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    levels: torch.Tensor | None,
    bias: torch.Tensor | None,
    bf16_weights: bool = False,
) -> torch.Tensor:
    """``x @ W.T + bias`` for an int4 matrix in the kernel's layout (its own 16 ``levels`` when
    given); the activations are rounded to bf16 first (the kernel multiplies in bf16, exactly, and
    sums in fp32). ``bf16_weights``: the decoded weights are rounded to bf16 too, as the GEMM does
    on AMX tiles (``torch.ops.chatpage.gemm_amx()``), whose products take bf16 on both sides."""
    xb = x.to(torch.bfloat16).float()
    w = dequantize_int4(q, scales, zeros, levels)
    if bf16_weights:
        w = w.to(torch.bfloat16).float()
    return _finish(xb @ w.t(), bias, x.dtype)


Q8_BLOCK = 32  # activation inputs per int8 block of the q8 GEMMs


Q8_INT8_PASSES = 2  # int8 matrices take their activations in two passes (gemm_q8.cpp)


def quantize_q8(x: torch.Tensor, passes: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The activations of the q8 GEMMs (``csrc/cpu/gemm_q8.cpp``): each block of 32 inputs of a
    row (zero-padded to whole blocks) as int8 levels ``round(x * (127 / amax))`` and its scale
    ``amax / 127`` (``amax`` its largest ``|x|``), computed in fp32; each further pass quantizes
    what the ones before left over (``x - levels * scale``). qa [M, passes * blocks, 32] int8 and
    d [M, passes * blocks] fp32, pass p's blocks after pass p - 1's."""
    m, k = x.shape
    blocks = -(-k // Q8_BLOCK)
    rest = torch.nn.functional.pad(x.float(), (0, blocks * Q8_BLOCK - k)).view(m, blocks, Q8_BLOCK)
    levels, scales = [], []
    for _ in range(passes):
        amax = rest.abs().amax(dim=-1)
        # a true division (torch computes ``127.0 / amax`` as a reciprocal times 127: rounded
        # twice)
        inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
        qa = torch.round(rest * inv[..., None])
        d = amax / 127.0
        rest = rest - qa * d[..., None]
        levels.append(qa.to(torch.int8))
        scales.append(d)
    return torch.cat(levels, dim=1), torch.cat(scales, dim=1)


def reference_q8_int8(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """:func:`reference_int8` with the activations quantized by :func:`quantize_q8` in
    ``Q8_INT8_PASSES`` passes: per block the exact integer dot product of the levels, times the
    block's scale, summed over the blocks in fp64, times the row's scale."""
    qa, d = quantize_q8(x, Q8_INT8_PASSES)
    n, k = qweight.shape
    blocks = qa.shape[1] // Q8_INT8_PASSES
    w = torch.nn.functional.pad(qweight.long(), (0, blocks * Q8_BLOCK - k)).view(n, blocks, -1)
    w = w.repeat(1, Q8_INT8_PASSES, 1)
    dots = torch.einsum("mbi,nbi->mnb", qa.long(), w)  # exact integers
    y = (dots.double() * d.double()[:, None, :]).sum(-1) * scales.double()
    return _finish(y.float(), bias, x.dtype)


def reference_q8_int4(
    x: torch.Tensor,
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    levels: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """:func:`reference_int4` with the activations quantized by :func:`quantize_q8` in one pass
    (the blocks are the matrix's groups of 32): per group ``d * (scale * sum levels[q] * qa +
    zero * sum qa)``, the integer sums exact, summed over the groups in fp64."""
    qa, d = quantize_q8(x)
    table = (UNIFORM_LEVELS if levels is None else levels).long()
    lv = table[unpack_int4(q).long()].view(q.shape[0], qa.shape[1], INT4_GROUP)
    dots = torch.einsum("mbi,nbi->mnb", qa.long(), lv).double()
    sums = qa.long().sum(-1).double()  # [M, blocks]
    per_block = dots * scales.double()[None] + sums[:, None, :] * zeros.double()[None]
    y = (per_block * d.double()[:, None, :]).sum(-1)
    return _finish(y.float(), bias, x.dtype)
