"""ggml's tensor types dequantized to fp32 with torch ops, block by block.

The same steps as gguf-py's numpy ``gguf.quants`` (its reference, tested bit-exact against ggml),
in the same order and in fp32, so the values are identical (``tests/engine/test_dequant.py`` checks each
type against it). torch runs them over both cores without numpy's temporaries per step: on the
default model the whole file dequantizes several times faster, which is what a fp32 start and the
first packing of a GGUF spend their time on.

Each function takes the blocks of a tensor as a ``[n_blocks, block_bytes]`` uint8 tensor and
returns ``[n_blocks, values_per_block]`` fp32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

QK_K = 256  # values per K-quant super-block
# IQ4_NL's and IQ4_XS's 16 non-linear levels
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of each block, as fp32 ``[n, 1]``."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def _bits(x: torch.Tensor, width: int, shifts: Sequence[int], mask: int) -> torch.Tensor:
    """``x [n, bytes]`` in groups of ``width`` bytes, each group shifted by every one of
    ``shifts`` in turn and masked: ``[n, bytes * len(shifts)]`` uint8 (ggml's order: a group's
    low bits, then its next bits, ...)."""
    n = x.shape[0]
    by = torch.tensor(shifts, dtype=torch.uint8).view(1, 1, -1, 1)
    return ((x.reshape(n, -1, 1, width) >> by) & mask).reshape(n, -1)


def _levels(nibbles: torch.Tensor) -> torch.Tensor:
    return torch.tensor(IQ4_LEVELS, dtype=torch.float32)[nibbles.long()]


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32).clone()


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _bits(b[:, 2:], 16, (0, 4), 0x0F).to(torch.int8) - 8
    return _half(b, 0) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _bits(b[:, 4:], 16, (0, 4), 0x0F).float()
    return _half(b, 0) * q + _half(b, 2)


def _q5(b: torch.Tensor, at: int) -> torch.Tensor:
    """Q5_0's and Q5_1's 5-bit values: the 32 high bits at ``at``, the nibbles after them."""
    high = _bits(b[:, at : at + 4], 1, range(8), 1)  # bit i of the little-endian uint32
    return _bits(b[:, at + 4 :], 16, (0, 4), 0x0F) | (high << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * (_q5(b, 2).to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * _q5(b, 4).float() + _half(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _half(b, 0)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n, scales = b.shape[0], b[:, :16]
    d, dmin = _half(b, 80), _half(b, 82)
    dl = (d * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).view(n, 16, 1)
    q = _bits(b[:, 16:80], 32, (0, 2, 4, 6), 3).view(n, 16, 16).float()
    return (dl * q - ml).view(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    packed = b[:, 96:108]
    low = _bits(packed[:, :8], 8, (0, 4), 0x0F)
    high = _bits(packed[:, 8:], 4, (0, 2, 4, 6), 3)
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (_half(b, 108) * scales).view(n, 16, 1)
    ql = _bits(b[:, 32:96], 32, (0, 2, 4, 6), 3).view(n, 16, 16)
    qh = _bits(b[:, :32], 32, range(8), 1).view(n, 16, 16) ^ 1  # a set bit means no offset
    q = (ql.to(torch.int8) - (qh << 2).to(torch.int8)).float()
    return (dl * q).view(n, QK_K)


def _scale_min_k4(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K's and Q5_K's eight 6-bit scales and mins from their 12 packed bytes."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _k_scaled(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``d * scale * q - dmin * min`` per 32 values of a Q4_K/Q5_K block (``q [n, 8, 32]``)."""
    n = b.shape[0]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d = (_half(b, 0) * sc.float()).view(n, 8, 1)
    dm = (_half(b, 2) * mn.float()).view(n, 8, 1)
    return (d * q - dm).view(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_scaled(b, _bits(b[:, 16:], 32, (0, 4), 0x0F).view(-1, 8, 32).float())


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    low = _bits(b[:, 48:], 32, (0, 4), 0x0F)
    high = _bits(b[:, 16:48], 32, range(8), 1)
    return _k_scaled(b, (low | (high << 4)).view(-1, 8, 32).float())


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_half(b, 208) * scales).view(n, 16, 1)
    ql = _bits(b[:, :128], 64, (0, 4), 0x0F)
    qh = _bits(b[:, 128:192], 32, (0, 2, 4, 6), 3)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).view(n, 16, 16).float()
    return (d * q).view(n, QK_K)


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * _levels(_bits(b[:, 2:], 16, (0, 4), 0x0F))


def iq4_xs_scales(b: torch.Tensor) -> torch.Tensor:
    """The scale d * (ls - 32) of each of an IQ4_XS super-block's eight sub-blocks of 32 values
    (its 6-bit ls: 4 bits in scales_l, 2 in scales_h), fp32 ``[n, 8]`` (exact: an fp16 times an
    integer of 6 bits)."""
    n = b.shape[0]
    high_bits = b[:, 2].to(torch.int32) | (b[:, 3].to(torch.int32) << 8)
    shifts = torch.arange(0, 16, 2, dtype=torch.int32)
    high = ((high_bits[:, None] >> shifts) & 3).to(torch.uint8)
    low_bytes = b[:, 4:8]
    low = torch.stack([low_bytes & 0x0F, low_bytes >> 4], dim=-1).view(n, 8)
    return _half(b, 0) * ((low | (high << 4)).to(torch.int8) - 32).float()


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    dl = iq4_xs_scales(b).view(n, 8, 1)
    q = _levels(_bits(b[:, 8:], 16, (0, 4), 0x0F)).view(n, 8, 32)
    return (dl * q).view(n, QK_K)


# ggml type id -> the function dequantizing its blocks (engine/load/gguf_file.py's TENSOR_TYPES)
DEQUANTIZE: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    0: _f32,
    1: _f16,
    30: _bf16,
    2: _q4_0,
    3: _q4_1,
    6: _q5_0,
    7: _q5_1,
    8: _q8_0,
    10: _q2_k,
    11: _q3_k,
    12: _q4_k,
    13: _q5_k,
    14: _q6_k,
    20: _iq4_nl,
    23: _iq4_xs,
}


def dequantize(blocks: torch.Tensor, type_id: int) -> torch.Tensor:
    """``blocks [n_blocks, block_bytes]`` (uint8) of ggml type ``type_id`` -> fp32
    ``[n_blocks, values_per_block]``."""
    return DEQUANTIZE[type_id](blocks)
