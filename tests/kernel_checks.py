"""Kernel checks shared by tests/test_kernels.py (CPU) and tests/gpu/test_cuda_kernels.py (CUDA):
each ``check_*`` runs a native kernel on a device and compares it with the torch reference in
engine/attention.py."""

from __future__ import annotations

import pytest
import torch

from chatpage.bench.kernel import make_paged_batch
from chatpage.engine import attention, ops

# a spread of lengths: 1 token, partial first block, exact multiples, >1000, odd sizes
LENGTHS = [1, 7, 16, 33, 250, 1037]


def tolerance(dtype: torch.dtype) -> dict:
    """assert_close tolerances: tight for fp32, about two ulps of the format otherwise."""
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    if dtype == torch.float16:
        return {"atol": 2e-3, "rtol": 2e-3}
    return {"atol": 2e-2, "rtol": 2e-2}


def native(name: str):
    """The registered op ``torch.ops.chatpage.<name>`` (building/loading the library first)."""
    assert ops.load(), ops.status()
    return getattr(torch.ops.chatpage, name)


# ---------------------------------------------------------------------------------------------
# checks shared with the CUDA tests
# ---------------------------------------------------------------------------------------------


def check_paged_attention(
    device,
    seq_lens,
    q_lens,
    *,
    dtype=torch.float32,
    query_dtype=None,
    int64_indexes=False,
    strided=False,
    seed=0,
    **shape,
) -> None:
    """paged_attention equals the reference on one batch (NaN-filled output: every row is written)."""
    pb = make_paged_batch(seq_lens, q_lens, dtype=dtype, device=device, seed=seed, **shape)
    query = pb.query if query_dtype is None else pb.query.to(query_dtype)
    tables, lens, starts = pb.block_tables, pb.seq_lens, pb.query_start_loc
    if int64_indexes:
        tables, lens, starts = tables.long(), lens.long(), starts.long()
    if strided:
        # a query sliced out of a fused projection, a table that is a column slice of a wider one
        fused = torch.randn(query.shape[0], query.shape[1] + 2, query.shape[2], device=device)
        fused[:, 1:-1] = query
        query = fused[:, 1:-1]
        wide = torch.full(
            (tables.shape[0], tables.shape[1] + 3), -1, dtype=tables.dtype, device=device
        )
        wide[:, : tables.shape[1]] = tables
        tables = wide[:, : tables.shape[1]]
        assert not query.is_contiguous() and not tables.is_contiguous()
    expected = torch.zeros_like(query)
    got = torch.full_like(query, float("nan"))
    args = (query, pb.k_cache, pb.v_cache, tables, lens, starts, pb.scale)
    attention.reference_paged_attention(expected, *args)
    native("paged_attention")(got, *args)
    torch.testing.assert_close(got, expected, **tolerance(query.dtype if query_dtype else dtype))


def check_bad_indices_raise(device) -> None:
    """Block ids outside the pool, a seq_len shorter than its queries and slots beyond the cache
    raise (the kernels would read or write out of bounds)."""
    attend = native("paged_attention")
    pb = make_paged_batch([40], [1], device=device)
    pb.block_tables[0, 1] = 10_000
    with pytest.raises(RuntimeError, match="out of range"):
        attend(torch.empty_like(pb.query), *pb.args(pb.query)[1:])
    pb = make_paged_batch([40, 5], [1, 3], device=device)
    pb.seq_lens[1] = 2
    with pytest.raises(RuntimeError, match="3 queries but seq_len 2"):
        attend(torch.empty_like(pb.query), *pb.args(pb.query)[1:])
    caches = [torch.zeros(2, 16, 1, 64, device=device) for _ in range(2)]
    key = torch.ones(2, 1, 64, device=device)
    with pytest.raises(RuntimeError, match="beyond the cache"):
        native("write_kv")(key, key, caches[0], caches[1], torch.tensor([3, 32], device=device))


def check_write_kv(device, dtype=torch.float32, key_dtype=None) -> None:
    """write_kv stores exactly what the reference stores; slot -1 is skipped."""
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, heads, dim = 6, 16, 3, 64
    fused = torch.randn(20, 2 * heads + 1, dim, generator=gen)  # key/value as views of one tensor
    key, value = fused[:, :heads], fused[:, heads : 2 * heads]
    if key_dtype is not None:
        key, value = key.to(key_dtype), value.to(key_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:20]
    slots[[3, 11]] = -1
    caches = [
        torch.randn(num_blocks, block_size, heads, dim, generator=gen).to(dtype) for _ in range(2)
    ]
    ref = [c.clone() for c in caches]
    attention.reference_write_kv(key, value, ref[0], ref[1], slots)
    dev = [c.to(device) for c in caches]
    native("write_kv")(key.to(device), value.to(device), dev[0], dev[1], slots.to(device))
    for got, want in zip(dev, ref, strict=True):
        assert torch.equal(got.cpu(), want)


def check_copy_blocks(device, dtype=torch.float32) -> None:
    """copy_blocks copies every listed block in every cache, bit for bit."""
    gen = torch.Generator().manual_seed(2)
    caches = [torch.randn(12, 16, 3, 64, generator=gen).to(dtype) for _ in range(4)]
    pairs = torch.tensor([[0, 7], [3, 4], [5, 11], [3, 9]], dtype=torch.int64)
    ref = [c.clone() for c in caches]
    attention.reference_copy_blocks(ref, pairs)
    dev = [c.to(device) for c in caches]
    native("copy_blocks")(dev, pairs.to(device))
    for got, want in zip(dev, ref, strict=True):
        assert torch.equal(got.cpu(), want)


def check_swap_blocks(src_device, dst_device, dtype=torch.float32) -> None:
    """swap_blocks moves blocks between pools (possibly across devices), bit for bit."""
    gen = torch.Generator().manual_seed(3)
    src = torch.randn(10, 16, 3, 64, generator=gen).to(dtype)
    dst = torch.randn(7, 16, 3, 64, generator=gen).to(dtype)
    for mapping in (
        torch.tensor([[9, 0], [2, 6], [4, 3]]),
        torch.tensor([[1, 1]], dtype=torch.int32),
    ):
        want = dst.clone()
        attention.reference_swap_blocks(src, want, mapping)
        s, d = src.to(src_device), dst.to(dst_device)
        native("swap_blocks")(s, d, mapping)
        assert torch.equal(d.cpu(), want)
