"""Kernel checks shared by tests/kernels/test_kernels.py (CPU) and tests/gpu/test_cuda_kernels.py (CUDA):
each ``check_*`` runs a native kernel on a device and compares it with the torch reference in
engine/model/attention.py. ``python tests/kernel_checks.py CACHE_DIR avx2`` runs the sliding-window,
int8-cache and row-invariance cases on an AVX2 build of the kernels (``ops.AVX2_CFLAGS``, in a process of its own: a second kernel
library cannot be loaded beside the first) and prints how many passed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chatpage.bench.kernel import make_paged_batch
from chatpage.engine.model import attention, kv_cache, ops

# a spread of lengths: 1 token, partial first block, exact multiples, >1000, odd sizes
LENGTHS = [1, 7, 16, 33, 250, 1037]
MIXED_LENS, MIXED_Q_LENS = [1037, 40, 300, 5, 64, 12], [1, 40, 120, 1, 17, 0]

# sliding windows (seq_lens, q_lens, window, shape): decode rows, prefill over a cached prefix,
# windows shorter than a block, not a multiple of it, exactly blocks, past every length, a long
# context split across threads, GQA, half-precision caches
WINDOW_CASES = [
    (LENGTHS, [1] * 6, 20, {}),
    (LENGTHS, [1] * 6, 1, {"block_size": 8}),
    (MIXED_LENS, MIXED_Q_LENS, 37, {"num_kv_heads": 3, "num_q_heads": 12}),
    (MIXED_LENS, MIXED_Q_LENS, 32, {"block_size": 16}),
    (MIXED_LENS, MIXED_Q_LENS, 5, {"block_size": 32, "num_kv_heads": 1, "num_q_heads": 4}),
    (MIXED_LENS, MIXED_Q_LENS, 4096, {}),
    ([3001, 2500], [1, 7], 700, {"head_dim": 128, "num_kv_heads": 2, "num_q_heads": 8}),
    ([300, 41], [30, 41], 50, {"head_dim": 40, "num_kv_heads": 1, "num_q_heads": 2}),
    (LENGTHS, [1, 1, 16, 5, 1, 1], 45, {"dtype": torch.bfloat16}),
    (MIXED_LENS, MIXED_Q_LENS, 70, {"dtype": torch.float16, "num_kv_heads": 3, "num_q_heads": 9}),
]


# int8 caches (attention.quantize_kv's rows): decode rows, prefill tiles over a cached prefix,
# windows, GQA groups of 1 to 4, the head dims of the fixed-size paths and runtime ones (40: the
# eight-lane path only; 160: AVX-512's integer key scores at a runtime width), blocks of 8 to 32
# tokens
INT8_CASES = [
    (LENGTHS, [1] * 6, 0, {}),
    (MIXED_LENS, MIXED_Q_LENS, 0, {"num_kv_heads": 3, "num_q_heads": 9}),
    (MIXED_LENS, MIXED_Q_LENS, 37, {"num_kv_heads": 3, "num_q_heads": 12}),
    (LENGTHS, [1] * 6, 1, {"block_size": 8}),
    (MIXED_LENS, MIXED_Q_LENS, 5, {"block_size": 32, "num_kv_heads": 1, "num_q_heads": 4}),
    ([3001, 2500], [1, 7], 0, {"head_dim": 128, "num_kv_heads": 2, "num_q_heads": 8}),
    ([300, 41], [30, 41], 50, {"head_dim": 40, "num_kv_heads": 1, "num_q_heads": 2}),
    ([260, 17], [1, 17], 0, {"head_dim": 256, "num_kv_heads": 1, "num_q_heads": 1}),
    ([70, 33], [1, 3], 0, {"head_dim": 96, "num_kv_heads": 2, "num_q_heads": 4}),
    ([90, 16], [1, 1], 9, {"head_dim": 160, "num_kv_heads": 1, "num_q_heads": 2}),
]


def tolerance(dtype: torch.dtype) -> dict:
    """assert_close tolerances: tight for fp32 and an int8 cache (the same values, the scale taken
    out of the sums: summation order apart), about two ulps of the format otherwise."""
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 1e-5}
    if dtype == torch.int8:
        return {"atol": 1e-4, "rtol": 1e-4}
    if dtype == torch.float16:
        return {"atol": 2e-3, "rtol": 2e-3}
    return {"atol": 2e-2, "rtol": 2e-2}


_OWN_BUILD: list[ops.KernelLoader] = []  # the AVX2 script's loader, once it loaded its build


def native(name: str):
    """The registered op ``torch.ops.chatpage.<name>`` (building/loading the library first)."""
    if not _OWN_BUILD:
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
    window=0,
    **shape,
) -> None:
    """paged_attention equals the reference on one batch (NaN-filled output: every row is written).
    With a ``window``, the table entries of the blocks before every query's window are then
    overwritten with ids outside the pool, and the kernel (and the reference) must give the same
    output: they never read those blocks."""
    pb = make_paged_batch(seq_lens, q_lens, dtype=dtype, device=device, seed=seed, **shape)
    query = pb.query if query_dtype is None else pb.query.to(query_dtype)
    if query_dtype == torch.float32 and pb.query.dtype != torch.float32:
        # fp32 queries of fp32's precision: the batch's half-precision ones are exact in fp32
        noise = torch.randn(query.shape, generator=torch.Generator().manual_seed(seed + 1))
        query = query + 1e-3 * noise.to(device)
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
    args = (query, pb.k_cache, pb.v_cache, tables, lens, starts, pb.scale, window)
    attention.reference_paged_attention(expected, *args)
    if window > 0:
        tables = freed_before_window(tables, lens, starts, window, pb.k_cache.shape[1])
        args = (query, pb.k_cache, pb.v_cache, tables, lens, starts, pb.scale, window)
        again = torch.full_like(query, float("nan"))
        attention.reference_paged_attention(again, *args)
        assert torch.equal(again, expected)
    native("paged_attention")(got, *args)
    torch.testing.assert_close(got, expected, **tolerance(query.dtype if query_dtype else dtype))


def freed_before_window(tables, lens, starts, window: int, block_size: int) -> torch.Tensor:
    """A copy of ``tables`` whose entries before each sequence's first block in the window of its
    first query hold ids outside any pool (the block manager may free those blocks)."""
    out = tables.clone()
    bad = torch.iinfo(torch.int32).max
    bounds = starts.tolist()
    for s, length in enumerate(lens.tolist()):
        first = attention.first_block(length - (bounds[s + 1] - bounds[s]), window, block_size)
        out[s, :first] = bad if s % 2 else -5
    return out


def check_window_cases(device) -> int:
    """Every case of :data:`WINDOW_CASES` on ``device``; returns how many ran."""
    for i, (seq_lens, q_lens, window, shape) in enumerate(WINDOW_CASES):
        check_paged_attention(device, seq_lens, q_lens, window=window, seed=i, **shape)
    return len(WINDOW_CASES)


# row invariance (rows_alone_cases): (window, cache dtype, torch threads; 0: as set)
ROWS_ALONE_CASES = [
    (0, torch.float32, 0),
    (300, torch.float32, 0),
    (0, torch.bfloat16, 1),
    (0, torch.int8, 0),
    (37, torch.bfloat16, 0),
]


def check_rows_alone(window: int, dtype: torch.dtype, threads: int = 0) -> None:
    """Row invariance (exact speculative decoding): each row of a sequence of up to 16 query rows
    gets the bits it gets as the one row of a decode step, whatever else the call holds (a
    prefill, other decodes): the rows that share an item (one piece each: one thread; or the
    same pieces of a long context split across threads) and the rows that do not."""
    op = native("paged_attention")
    b = make_paged_batch(
        [1300, 700, 90], [16, 40, 1], num_kv_heads=3, num_q_heads=9, dtype=dtype, seed=5
    )
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        out = torch.empty_like(b.query)
        op(*b.args(out), window)
        for r in range(16):  # row r of sequence 0 alone: position 1300 - 16 + r
            alone = torch.empty_like(b.query[r : r + 1])
            op(
                alone,
                b.query[r : r + 1],
                b.k_cache,
                b.v_cache,
                b.block_tables[:1],
                torch.tensor([1300 - 15 + r], dtype=torch.int32),
                torch.tensor([0, 1], dtype=torch.int32),
                b.scale,
                window,
            )
            assert torch.equal(out[r], alone[0]), (r, window, dtype, threads)
    finally:
        torch.set_num_threads(before)


def rows_alone_cases() -> int:
    """Every case of :data:`ROWS_ALONE_CASES` (CPU); returns how many ran."""
    for case in ROWS_ALONE_CASES:
        check_rows_alone(*case)
    return len(ROWS_ALONE_CASES)


def check_int8_cases(device) -> int:
    """Every case of :data:`INT8_CASES` on ``device``; returns how many ran."""
    for i, (seq_lens, q_lens, window, shape) in enumerate(INT8_CASES):
        check_paged_attention(
            device, seq_lens, q_lens, window=window, seed=100 + i, dtype=torch.int8, **shape
        )
    return len(INT8_CASES)


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
    """write_kv stores exactly what the reference stores (an int8 cache: the same bytes); slot -1
    is skipped."""
    gen = torch.Generator().manual_seed(1)
    num_blocks, block_size, heads, dim = 6, 16, 3, 64
    fused = torch.randn(20, 2 * heads + 1, dim, generator=gen)  # key/value as views of one tensor
    key, value = fused[:, :heads], fused[:, heads : 2 * heads]
    if key_dtype is not None:
        key, value = key.to(key_dtype), value.to(key_dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:20]
    slots[[3, 11]] = -1
    row = kv_cache.row_size(dim, dtype)
    caches = [
        torch.randn(num_blocks, block_size, heads, row, generator=gen).to(dtype) for _ in range(2)
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


def run_other_build(script: str, build: str = "avx2") -> list[str]:
    """Run ``tests/<script>`` against another build of the kernels (``ops.TEST_BUILDS[build]``:
    the AVX2 one by default), in a process of its own (the build's cache is kept between runs: it
    takes a minute or more); the words of its stdout."""
    root = Path(__file__).resolve().parents[1]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(root / "tests" / script), str(ops.cache_root() / build), build],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


def main(cache_dir: Path, build: str) -> None:
    loader = ops.KernelLoader(cache_dir=cache_dir, cflags=ops.TEST_BUILDS[build])
    assert loader.load(), loader.status()
    _OWN_BUILD.append(loader)
    print(f"{check_window_cases('cpu') + check_int8_cases('cpu') + rows_alone_cases()} passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
