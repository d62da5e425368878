"""GGUF Q4_0 / Q4_1 matrices as chatpage's int4 straight from their blocks (no fp32, no
re-quantization): re-quantizing the file's dequantized values with int4's own min/max groups added
as much error again as the file had (llama.cpp's Q4_0 copy of the default model: +18% perplexity
against llama.cpp on the same file).

A ggml Q4_0 block is 32 values: an fp16 ``d``, then 16 bytes where byte j holds value j in its
low nibble and value j + 16 in its high one, w = (q - 8) * d: the int4 layout of
``engine/gemv.py`` (groups of 32, the same nibbles) with scale = d and zero = 0. Q4_1 adds an fp16
``m``, w = q * d + m = (q - 8) * d + (m + 8 d): scale = d, zero = m + 8 d. The nibbles are copied
as they are; only the scales and zeros are rounded, to bf16.
"""

from __future__ import annotations

import torch

from chatpage.engine.gguf_file import GGUFFile

# ggml type id -> the byte offset of its nibbles in a block (after d, and Q4_1's m)
Q4_TYPES = {2: 2, 3: 4}  # Q4_0, Q4_1
# 4-bit types whose 16 levels are not evenly spaced (ggml's kvalues_iq4nl): int4 cannot hold them
NON_UNIFORM = {20: "IQ4_NL", 23: "IQ4_XS"}


def _half(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block, as fp32 [n_blocks]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).view(-1).float()


def int4_of(
    gf: GGUFFile, name: str, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensor ``name`` of ``gf`` (a Q4_0 or Q4_1 matrix) as int4: (q4 [N, K/2] uint8, scales and
    zeros [N, K/32] bf16), row i from the file's row ``rows[i]`` when given."""
    info = gf.tensors[name]
    nibbles = Q4_TYPES[info.type_id]
    blocks = gf.blocks(name)
    n = info.shape[0]
    d = _half(blocks, 0)
    zero = torch.zeros_like(d) if info.type_id == 2 else _half(blocks, 2) + 8 * d
    q4 = blocks[:, nibbles : nibbles + 16].reshape(n, -1)  # a copy: blocks are wider than 16
    scales, zeros = d.view(n, -1).to(torch.bfloat16), zero.view(n, -1).to(torch.bfloat16)
    if rows is not None:
        return q4.index_select(0, rows), scales.index_select(0, rows), zeros.index_select(0, rows)
    return q4, scales, zeros


def is_int4(gf: GGUFFile, name: str) -> bool:
    """Whether tensor ``name`` of ``gf`` is a matrix int4 holds exactly (Q4_0, Q4_1)."""
    info = gf.tensors[name]
    return info.type_id in Q4_TYPES and len(info.shape) == 2


def non_uniform(gf: GGUFFile) -> list[str]:
    """The non-uniform 4-bit types (IQ4_NL, IQ4_XS) of ``gf``'s matrices, if any."""
    found = {NON_UNIFORM.get(t.type_id) for t in gf.tensors.values() if len(t.shape) == 2}
    return sorted(t for t in found if t)


def int4_notes(gf: GGUFFile) -> list[str]:
    """What the user is told when int4 of ``gf`` runs as int8 rows (:func:`non_uniform`)."""
    types = non_uniform(gf)
    if not types:
        return []
    return [
        f"{gf.path.name} holds {'/'.join(types)} matrices, whose uneven 4-bit levels int4 cannot "
        "hold: its weights run as int8 rows (twice int4's size, llama.cpp's quality)"
    ]
