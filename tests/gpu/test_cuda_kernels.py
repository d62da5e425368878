"""The CUDA kernels against the torch reference: the checks of tests/kernel_checks.py on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import kernel_checks as cases  # noqa: E402

from chatpage.engine.model import attention, ops  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DEVICE = "cuda"


def test_cuda_ops_are_native():
    assert ops.load(), ops.status()
    assert ops.available(torch.device("cuda")), ops.status()
    assert ops.status() == "native"


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4, 8])
def test_decode_batch(block_size, head_dim, gqa):
    cases.check_paged_attention(
        DEVICE,
        cases.LENGTHS,
        [1] * len(cases.LENGTHS),
        block_size=block_size,
        head_dim=head_dim,
        num_kv_heads=2,
        num_q_heads=2 * gqa,
    )


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("gqa", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_prefill_and_decode(block_size, gqa, dtype):
    seq_lens = [1037, 40, 300, 5, 64, 12]
    q_lens = [1, 40, 120, 1, 17, 0]
    cases.check_paged_attention(
        DEVICE,
        seq_lens,
        q_lens,
        dtype=dtype,
        block_size=block_size,
        num_kv_heads=3,
        num_q_heads=3 * gqa,
        seed=block_size + gqa,
    )


@pytest.mark.parametrize("head_dim", [80, 96, 256])
def test_other_head_dims(head_dim):
    cases.check_paged_attention(
        DEVICE, [300, 17, 2], [30, 1, 1], head_dim=head_dim, num_kv_heads=2, num_q_heads=8
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_split_k_long_contexts(dtype):
    # few rows and long contexts take the partitioned (split-K) path
    cases.check_paged_attention(DEVICE, [9000], [1], dtype=dtype)
    cases.check_paged_attention(
        DEVICE, [4100, 300, 2], [1, 1, 1], dtype=dtype, num_kv_heads=1, num_q_heads=4
    )
    cases.check_paged_attention(DEVICE, [5000], [7], dtype=dtype, block_size=32)


def test_sliding_windows_skip_freed_blocks():
    assert cases.check_window_cases(DEVICE) == len(cases.WINDOW_CASES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_k_with_a_window(dtype):
    # partitions wholly before the window exit, and the merge starts at the first one used
    cases.check_paged_attention(DEVICE, [9000], [1], dtype=dtype, window=1000)
    cases.check_paged_attention(DEVICE, [5000, 300], [7, 1], dtype=dtype, window=600)


def test_large_gqa_group_is_split_across_ctas():
    cases.check_paged_attention(
        DEVICE, [700, 3], [1, 3], num_kv_heads=1, num_q_heads=32, head_dim=128
    )


def test_strided_inputs_and_int64_indexes():
    cases.check_paged_attention(
        DEVICE, [100, 37, 500], [1, 37, 4], strided=True, int64_indexes=True
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_cache_fp32_query(dtype):
    cases.check_paged_attention(DEVICE, [600, 20], [1, 20], dtype=dtype, query_dtype=torch.float32)


def test_int8_caches_match_the_reference():
    assert cases.check_int8_cases(DEVICE) == len(cases.INT8_CASES)


@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16])
def test_int8_cache_split_k_and_windows(query_dtype):
    """Long contexts split across CTAs over an int8 cache, with and without a window, from fp32
    and bf16 queries."""
    int8 = {"dtype": torch.int8, "query_dtype": query_dtype}
    cases.check_paged_attention(DEVICE, [9000], [1], **int8)
    cases.check_paged_attention(DEVICE, [5000, 300], [7, 1], window=600, **int8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_write_kv(dtype):
    cases.check_write_kv(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_write_kv_converts_dtype(dtype):
    cases.check_write_kv(
        DEVICE, dtype, key_dtype=torch.bfloat16 if dtype == torch.int8 else torch.float32
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
def test_copy_blocks(dtype):
    cases.check_copy_blocks(DEVICE, dtype)


@pytest.mark.parametrize(("src", "dst"), [("cuda", "cpu"), ("cpu", "cuda"), ("cuda", "cuda")])
def test_swap_blocks(src, dst):
    cases.check_swap_blocks(src, dst)


def test_dispatch_uses_native_cuda(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("the reference ran although the native op is loaded")

    monkeypatch.setattr(attention, "reference_paged_attention", forbidden)
    pb = cases.make_paged_batch([200, 4], [1, 4], device=DEVICE)
    out = torch.empty_like(pb.query)
    attention.paged_attention(*pb.args(out))
    assert torch.isfinite(out).all()


def test_bad_indices_are_errors_not_crashes():
    cases.check_bad_indices_raise(DEVICE)
