"""Paged attention: the torch reference (the specification) and the single dispatch point.

Kernel contract: docs/kernels.md ("Paged attention"): the cache layout, ``write_kv``,
``paged_attention`` (prefill, prefill over a cached prefix and decode as one op, GQA, sliding
windows, softcap), ``copy_blocks`` and ``swap_blocks``.

The ``reference_*`` functions are the specification the native kernels are tested against. The
public functions dispatch to the csrc extension when it is loaded (engine/model/ops.py) and fall back to
the reference otherwise.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from chatpage.engine.model import ops

# ---------------------------------------------------------------------------------------------
# the int8 cache layout
# ---------------------------------------------------------------------------------------------

INT8_SCALE_BYTES = 2
"""An int8 cache row (one token's one KV head) is its ``head_dim`` values, then their scale as
fp16 (2 bytes): ``[num_blocks, block_size, num_kv_heads, head_dim + 2]`` int8, the value
``q * scale`` with ``scale = max |x| / 127`` of the row (docs/kernels.md, "The int8 KV cache")."""


def cache_head_dim(cache: Tensor) -> int:
    """The head_dim a cache holds: its last dim, less the scale's bytes for an int8 cache."""
    extra = INT8_SCALE_BYTES if cache.dtype == torch.int8 else 0
    return cache.shape[-1] - extra


def quantize_kv(x: Tensor) -> Tensor:
    """Rows ``[..., D]`` as int8 cache rows ``[..., D + 2]``: ``round(x / scale)`` with the
    row's scale ``max |x| / 127`` rounded to fp16 first (a row of zeros: scale 0, values 0)."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16)
    s = scale.float()
    q = torch.where(s > 0, x / s, 0.0).round().clamp(-127, 127).to(torch.int8)
    return torch.cat([q, scale.view(torch.int8)], dim=-1)


def dequantize_kv(rows: Tensor, dtype: torch.dtype) -> Tensor:
    """int8 cache rows ``[..., D + 2]`` as ``[..., D]`` values of ``dtype``."""
    scale = rows[..., -INT8_SCALE_BYTES:].contiguous().view(torch.float16).float()
    return (rows[..., :-INT8_SCALE_BYTES].float() * scale).to(dtype)


def _read(rows: Tensor, dtype: torch.dtype) -> Tensor:
    """Cache rows as values of ``dtype`` (an int8 cache's dequantized)."""
    return dequantize_kv(rows, dtype) if rows.dtype == torch.int8 else rows.to(dtype)


def stored(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Rows ``[..., D]`` as a cache of ``dtype`` stores them."""
    return quantize_kv(x) if dtype == torch.int8 else x.to(dtype)


# ---------------------------------------------------------------------------------------------
# torch reference
# ---------------------------------------------------------------------------------------------


def reference_write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store ``key``/``value`` ``[T, Hkv, D]`` into the caches at ``slot_mapping`` ``[T]`` (an
    int8 cache: quantized, ``quantize_kv``)."""
    num_blocks, block_size = k_cache.shape[0], k_cache.shape[1]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    k_flat.index_copy_(0, slots, stored(key[keep], k_cache.dtype))
    v_flat.index_copy_(0, slots, stored(value[keep], v_cache.dtype))


def _gather(cache: torch.Tensor, table: torch.Tensor, length: int) -> torch.Tensor:
    """Contiguous ``[length, Hkv, D]`` view of one sequence's keys or values."""
    blocks = cache.index_select(0, table)  # [nb, bs, Hkv, D]
    return blocks.flatten(0, 1)[:length]


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float, softcap: float) -> Tensor:
    """Softmax attention of ``q`` [..., Hq, Lq, D] over ``k``/``v`` [..., Hkv, L, D] where ``mask``
    (broadcast to the scores) is true, the scores soft-capped when ``softcap`` > 0."""
    if softcap <= 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = torch.tanh(q @ k.transpose(-1, -2) * scale / softcap) * softcap
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def first_block(first_query_position: int, window: int, block_size: int) -> int:
    """The first block a sequence's attention reads: the one holding the earliest key in the
    window of its first query (block 0 without a window)."""
    return max(0, first_query_position - window + 1) // block_size if window > 0 else 0


def reference_paged_attention(
    out: torch.Tensor,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Write attention of ``query`` ``[T, Hq, D]`` over the paged caches into ``out`` (``window``
    and ``softcap``: see the module docstring).

    Decode rows (one query per sequence) are batched into one SDPA over a padded gather;
    sequences with several queries (prefill, chunked prefill over a cached prefix) run one by one.
    """
    block_size = k_cache.shape[1]
    device = query.device
    starts = query_start_loc.cpu().tolist()
    lens = seq_lens.cpu().tolist()
    q_lens = [starts[i + 1] - starts[i] for i in range(len(lens))]
    decode = [i for i, q in enumerate(q_lens) if q == 1]
    others = [i for i, q in enumerate(q_lens) if q > 1]

    if decode:
        idx = torch.tensor(decode, dtype=torch.long, device=device)
        ctx = seq_lens[idx].long()
        max_len = int(ctx.max())
        nb = (max_len + block_size - 1) // block_size
        tables = block_tables[idx, :nb].long()
        if window > 0:  # entries before each row's window are never read (any value there)
            first_blocks = (ctx - window).clamp(min=0) // block_size
            cols = torch.arange(nb, device=device).unsqueeze(0)
            tables = torch.where(cols < first_blocks.unsqueeze(1), 0, tables)
        # [B, nb, bs, Hkv, D] -> [B, Hkv, L, D]
        k = _read(k_cache[tables].flatten(1, 2)[:, :max_len], query.dtype).transpose(1, 2)
        v = _read(v_cache[tables].flatten(1, 2)[:, :max_len], query.dtype).transpose(1, 2)
        rows = query_start_loc[idx].long()
        q = query[rows].unsqueeze(2)  # [B, Hq, 1, D]
        key_pos = torch.arange(max_len, device=device).unsqueeze(0)
        mask = key_pos < ctx.unsqueeze(1)  # [B, L]
        if window > 0:
            mask &= key_pos >= (ctx - window).unsqueeze(1)
        o = _attend(q, k, v, mask[:, None, None, :], scale, softcap)
        out[rows] = o.squeeze(2).to(out.dtype)

    for i in others:
        q_len, length = q_lens[i], lens[i]
        nb = (length + block_size - 1) // block_size
        lo = first_block(length - q_len, window, block_size)
        table = block_tables[i, lo:nb].long()
        first = lo * block_size  # the position of the first key gathered
        k = _read(_gather(k_cache, table, length - first), query.dtype).transpose(
            0, 1
        )  # [Hkv, L, D]
        v = _read(_gather(v_cache, table, length - first), query.dtype).transpose(0, 1)
        q = query[starts[i] : starts[i + 1]].transpose(0, 1)  # [Hq, q_len, D]
        # query j sits at absolute position length - q_len + j and sees keys 0..that position
        q_pos = torch.arange(length - q_len, length, device=device).unsqueeze(1)
        key_pos = torch.arange(first, length, device=device).unsqueeze(0)
        mask = key_pos <= q_pos  # [q_len, L]
        if window > 0:
            mask &= key_pos > q_pos - window
        o = _attend(q, k, v, mask, scale, softcap)
        out[starts[i] : starts[i + 1]] = o.transpose(0, 1).to(out.dtype)


def reference_copy_blocks(caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """``src_to_dst`` ``[N, 2]``: block ``dst`` becomes a copy of block ``src`` in every cache."""
    if src_to_dst.numel() == 0:
        return
    src = src_to_dst[:, 0].long().to(caches[0].device)
    dst = src_to_dst[:, 1].long().to(caches[0].device)
    for cache in caches:
        cache.index_copy_(0, dst, cache.index_select(0, src))


def reference_swap_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """``mapping`` ``[N, 2]``: block ``mapping[i, 0]`` of ``src`` goes to ``mapping[i, 1]`` of ``dst``."""
    if mapping.numel() == 0:
        return
    src_idx = mapping[:, 0].long().to(src.device)
    dst_idx = mapping[:, 1].long().to(dst.device)
    dst.index_copy_(0, dst_idx, src.index_select(0, src_idx).to(dst.device))


# ---------------------------------------------------------------------------------------------
# dispatch: native kernels when the extension is loaded, the reference otherwise
# ---------------------------------------------------------------------------------------------


def write_kv(
    key: Tensor, value: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Store new keys/values into the paged caches (native op when available)."""
    if ops.available(k_cache.device):
        torch.ops.chatpage.write_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        reference_write_kv(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    out: Tensor,
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    query_start_loc: Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """Attention over the paged caches for a mixed prefill/decode batch (see module docstring)."""
    if softcap > 0:
        reference_paged_attention(
            out,
            query,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            query_start_loc,
            scale,
            window,
            softcap,
        )
    elif ops.available(query.device):
        torch.ops.chatpage.paged_attention(
            out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window
        )
    else:
        reference_paged_attention(
            out, query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window
        )


def copy_blocks(caches: list[torch.Tensor], src_to_dst: torch.Tensor) -> None:
    """Copy-on-write: duplicate blocks within each cache."""
    if src_to_dst.numel() == 0:
        return
    if ops.available(caches[0].device):
        torch.ops.chatpage.copy_blocks(caches, src_to_dst)
    else:
        reference_copy_blocks(caches, src_to_dst)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """Move blocks between the device pool and the CPU swap pool."""
    if mapping.numel() == 0:
        return
    if ops.available(src.device) and ops.available(dst.device):
        torch.ops.chatpage.swap_blocks(src, dst, mapping)
    else:
        reference_swap_blocks(src, dst, mapping)
