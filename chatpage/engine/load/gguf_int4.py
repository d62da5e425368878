"""GGUF 4-bit matrices as chatpage's int4 straight from their blocks (no fp32, no
re-quantization): re-quantizing the file's dequantized values with int4's own min/max groups added
as much error again as the file had (llama.cpp's Q4_0 copy of the default model: +18% perplexity
against llama.cpp on the same file; its IQ4_NL copy: +40%).

A ggml Q4_0 block is 32 values: an fp16 ``d``, then 16 bytes where byte j holds value j in its
low nibble and value j + 16 in its high one, w = (q - 8) * d: the int4 layout of
``engine/model/gemv.py`` (groups of 32, the same nibbles) with scale = d and zero = 0. Q4_1 adds an fp16
``m``, w = q * d + m = (q - 8) * d + (m + 8 d): scale = d, zero = m + 8 d. IQ4_NL is Q4_0's block
with ggml's 16 uneven levels (``kvalues_iq4nl``), w = level[q] * d: int4 with that table of levels
(``<name>.levels``), scale = d, zero = 0. IQ4_XS holds super-blocks of 256 values: an fp16 ``d``,
a 6-bit ``ls`` per sub-block of 32 (its low 4 bits in 4 bytes of scales_l, its high 2 in a
uint16 scales_h), then each sub-block's 16 bytes of nibbles in Q4_0's order; w = level[q] * d *
(ls - 32): the same table, scale = d * (ls - 32). The nibbles are copied as they are; only the
scales and zeros are rounded, to bf16.
"""

from __future__ import annotations

import torch

from chatpage.engine.load.dequant import IQ4_LEVELS, iq4_xs_scales
from chatpage.engine.load.gguf_file import GGUFFile

Q4_0, Q4_1, IQ4_NL, IQ4_XS = 2, 3, 20, 23  # ggml type ids
# ggml type id -> the byte offset of its nibbles in a block (after d, and Q4_1's m; IQ4_XS: after
# d and the scales)
NIBBLES_AT = {Q4_0: 2, Q4_1: 4, IQ4_NL: 2, IQ4_XS: 8}
# the types whose levels are ggml's kvalues_iq4nl (the others': q - 8)
IQ4_TYPES = (IQ4_NL, IQ4_XS)


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block, as fp32 [n_blocks]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).view(-1).float()


def levels_of(type_id: int) -> torch.Tensor | None:
    """The int8 [16] table of levels of a 4-bit type int4 holds (:func:`is_int4`); None for the
    uniform levels q - 8 (Q4_0, Q4_1)."""
    return torch.tensor(IQ4_LEVELS, dtype=torch.int8) if type_id in IQ4_TYPES else None


def int4_of(
    gf: GGUFFile, name: str, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensor ``name`` of ``gf`` (a matrix of a type :func:`is_int4` takes) as int4: (q4 [N, K/2]
    uint8, scales and zeros [N, K/32] bf16), row i from the file's row ``rows[i]`` when given; its
    levels are :func:`levels_of` its type."""
    info = gf.tensors[name]
    blocks = gf.blocks(name)
    n, at = info.shape[0], NIBBLES_AT[info.type_id]
    if info.type_id == IQ4_XS:
        scale = iq4_xs_scales(blocks).view(-1)
    else:
        scale = _half(blocks, 0)
    zero = _half(blocks, 2) + 8 * scale if info.type_id == Q4_1 else torch.zeros_like(scale)
    q4 = blocks[:, at:].reshape(n, -1)  # a copy: blocks are wider than their nibbles
    scales, zeros = scale.view(n, -1).to(torch.bfloat16), zero.view(n, -1).to(torch.bfloat16)
    if rows is not None:
        return q4.index_select(0, rows), scales.index_select(0, rows), zeros.index_select(0, rows)
    return q4, scales, zeros


def is_int4(gf: GGUFFile, name: str) -> bool:
    """Whether tensor ``name`` of ``gf`` is a matrix int4 holds exactly (Q4_0, Q4_1; IQ4_NL and
    IQ4_XS with their table of levels)."""
    info = gf.tensors[name]
    return info.type_id in NIBBLES_AT and len(info.shape) == 2
