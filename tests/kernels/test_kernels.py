"""The native kernels (csrc/, torch.ops.chatpage.*) against the torch reference in engine/model/attention.py.

The ``check_*`` helpers (tests/kernel_checks.py) take a device; tests/gpu/test_cuda_kernels.py
runs them on CUDA.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from kernel_checks import (
    INT8_CASES,
    LENGTHS,
    ROWS_ALONE_CASES,
    WINDOW_CASES,
    check_bad_indices_raise,
    check_copy_blocks,
    check_int8_cases,
    check_paged_attention,
    check_rows_alone,
    check_swap_blocks,
    check_window_cases,
    check_write_kv,
    make_paged_batch,
    native,
    run_other_build,
)

from chatpage.engine.model import attention, ops

DEVICE = "cpu"


# ---------------------------------------------------------------------------------------------
# paged_attention
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("gqa", [1, 3, 4, 8])
def test_decode_batch(block_size, head_dim, gqa):
    check_paged_attention(
        DEVICE,
        LENGTHS,
        [1] * len(LENGTHS),
        block_size=block_size,
        head_dim=head_dim,
        num_kv_heads=2,
        num_q_heads=2 * gqa,
    )


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("gqa", [1, 3, 8])
def test_mixed_prefill_and_decode(block_size, gqa):
    # a fresh prompt, a prompt over a cached prefix, decodes, and a sequence with no query
    seq_lens = [1037, 40, 300, 5, 64, 12]
    q_lens = [1, 40, 120, 1, 17, 0]
    check_paged_attention(
        DEVICE,
        seq_lens,
        q_lens,
        block_size=block_size,
        num_kv_heads=3,
        num_q_heads=3 * gqa,
        seed=block_size + gqa,
    )


@pytest.mark.parametrize("head_dim", [80, 96])
def test_other_head_dims(head_dim):
    check_paged_attention(
        DEVICE, [300, 17, 2], [30, 1, 1], head_dim=head_dim, num_kv_heads=2, num_q_heads=8
    )


def test_runtime_head_dim():
    # a head_dim without its own instantiation takes the generic path
    check_paged_attention(DEVICE, [70, 5], [9, 1], head_dim=40, num_kv_heads=1, num_q_heads=4)


def test_long_context_split_across_threads():
    # batch 1 and 2 with long contexts: the context is split into pieces and merged
    check_paged_attention(DEVICE, [3001], [1])
    check_paged_attention(DEVICE, [2500, 40], [1, 1], num_kv_heads=1, num_q_heads=4)
    check_paged_attention(DEVICE, [1500], [6], block_size=32)


@pytest.mark.parametrize("case", ROWS_ALONE_CASES)
def test_a_few_rows_of_a_sequence_are_computed_as_each_row_alone(case):
    check_rows_alone(*case)


def test_single_thread_matches():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        check_paged_attention(DEVICE, [1200, 3], [1, 3])
    finally:
        torch.set_num_threads(threads)


def test_strided_inputs_and_int64_indexes():
    check_paged_attention(DEVICE, [100, 37, 500], [1, 37, 4], strided=True, int64_indexes=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_caches(dtype):
    check_paged_attention(DEVICE, LENGTHS, [1, 1, 16, 5, 1, 1], dtype=dtype)


def test_bf16_cache_fp32_query():
    # the reference upcasts K/V to the query's fp32: the kernel must agree to fp32 precision
    check_paged_attention(
        DEVICE, [600, 20], [1, 20], dtype=torch.bfloat16, query_dtype=torch.float32
    )


@pytest.mark.parametrize("query_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "shape",
    [
        {"head_dim": 64, "num_kv_heads": 3, "num_q_heads": 9},
        {"head_dim": 64, "num_kv_heads": 2, "num_q_heads": 2, "block_size": 32},
        {"head_dim": 96, "num_kv_heads": 2, "num_q_heads": 8},
        {"head_dim": 128, "num_kv_heads": 1, "num_q_heads": 8, "block_size": 32},
        {"head_dim": 256, "num_kv_heads": 2, "num_q_heads": 4},
        {"head_dim": 64, "num_kv_heads": 2, "num_q_heads": 6, "block_size": 8},
    ],
)
@pytest.mark.parametrize("window", [0, 37])
def test_prefill_tiles_over_a_bf16_cache(query_dtype, shape, window):
    """Tiles of many rows over a bf16 cache (on AMX's tiles where the CPU has them: in 32-key
    chunks of two block halves, a chunk cut short at a prompt's end or a piece's, a block of 32
    holding a whole chunk, blocks of 8 kept off the tiles) agree with the reference: to fp32
    precision for fp32 queries, to bf16's for bf16 ones."""
    check_paged_attention(
        DEVICE,
        [1037, 300, 40, 75, 5],
        [120, 300, 40, 19, 1],
        dtype=torch.bfloat16,
        query_dtype=query_dtype,
        window=window,
        **shape,
    )


def test_rows_past_the_batch_are_left_alone():
    pb = make_paged_batch([50, 9], [1, 2])
    query = torch.cat([pb.query, torch.randn(3, *pb.query.shape[1:])])
    out = torch.full_like(query, 7.0)
    native("paged_attention")(
        out,
        query,
        pb.k_cache,
        pb.v_cache,
        pb.block_tables,
        pb.seq_lens,
        pb.query_start_loc,
        pb.scale,
    )
    assert torch.equal(out[3:], torch.full_like(out[3:], 7.0))
    assert torch.isfinite(out[:3]).all()


def test_sliding_windows_match_the_reference_and_skip_freed_blocks():
    assert check_window_cases(DEVICE) == len(WINDOW_CASES)


def test_the_reference_window_is_the_last_window_keys():
    # the reference against attention written out: query at p sees keys p - window < j <= p
    pb = make_paged_batch([45, 30], [45, 1], block_size=8, num_kv_heads=1, num_q_heads=2, seed=4)
    out = torch.empty_like(pb.query)
    attention.reference_paged_attention(out, *pb.args(pb.query)[1:], 10)
    for s, rows in ((0, range(45)), (1, [45])):
        length = int(pb.seq_lens[s])
        table = pb.block_tables[s, : -(-length // 8)].long()
        k = pb.k_cache[table].flatten(0, 1)[:length, 0]
        v = pb.v_cache[table].flatten(0, 1)[:length, 0]
        for row in rows:
            p = length - 1 if s == 1 else row
            keys = range(max(0, p - 9), p + 1)
            w = torch.softmax(pb.query[row] @ k[list(keys)].T * pb.scale, dim=-1)
            torch.testing.assert_close(out[row], w @ v[list(keys)])


@pytest.mark.slow  # the kernels built for another ISA, run in a process of their own
def test_the_avx2_build_matches_the_reference_with_windows_and_int8():
    """The window, int8 and row-invariance cases against a build without AVX-512 (vec.h's
    eight-lane paths)."""
    cases = len(WINDOW_CASES) + len(INT8_CASES) + len(ROWS_ALONE_CASES)
    assert run_other_build("kernel_checks.py")[-2:] == [str(cases), "passed"]


def test_int8_caches_match_the_reference():
    """Decode, prefill tiles and windows over int8 rows (values and scale) as the reference
    dequantizes them."""
    assert check_int8_cases(DEVICE) == len(INT8_CASES)


def test_int8_rows_keep_the_values_within_half_a_step():
    """quantize_kv: each value comes back within half its row's step (max |x| / 127), a row of
    zeros as zeros, and the row's largest value exactly up to the fp16 scale."""
    x = torch.randn(50, 3, 64, generator=torch.Generator().manual_seed(5)) * 4
    x[7, 1] = 0
    rows = attention.quantize_kv(x)
    assert rows.dtype == torch.int8 and rows.shape == (50, 3, 64 + attention.INT8_SCALE_BYTES)
    back = attention.dequantize_kv(rows, torch.float32)
    step = x.abs().amax(dim=-1, keepdim=True) / 127
    assert ((back - x).abs() <= step * 0.502 + 1e-6).all()
    assert torch.equal(back[7, 1], torch.zeros(64))
    assert rows[..., :64].abs().amax(dim=-1)[x.abs().amax(dim=-1) > 0].eq(127).all()


def test_bad_indices_are_errors_not_crashes():
    check_bad_indices_raise(DEVICE)


# ---------------------------------------------------------------------------------------------
# cache ops
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_write_kv(dtype):
    check_write_kv(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_write_kv_converts_dtype(dtype):
    check_write_kv(
        DEVICE, dtype, key_dtype=torch.float32 if dtype != torch.int8 else torch.bfloat16
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_copy_blocks(dtype):
    check_copy_blocks(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_swap_blocks(dtype):
    check_swap_blocks(DEVICE, DEVICE, dtype)


# ---------------------------------------------------------------------------------------------
# loading, dispatch, fallback
# ---------------------------------------------------------------------------------------------


def test_native_ops_are_the_ones_used(monkeypatch):
    assert ops.load() and ops.available(torch.device("cpu")) and ops.available("cpu")
    assert ops.status() == "native"

    def forbidden(*args, **kwargs):
        raise AssertionError("the reference ran although the native op is loaded")

    for name in ("write_kv", "paged_attention", "copy_blocks", "swap_blocks"):
        monkeypatch.setattr(attention, f"reference_{name}", forbidden)
    pb = make_paged_batch([20, 3], [4, 1])
    out = torch.empty_like(pb.query)
    attention.paged_attention(*pb.args(out))
    attention.write_kv(
        pb.query[:, :3],
        pb.query[:, 3:6],
        pb.k_cache,
        pb.v_cache,
        torch.arange(5, dtype=torch.int64),
    )
    pairs = torch.tensor([[0, 2]])
    attention.copy_blocks([pb.k_cache, pb.v_cache], pairs)
    attention.swap_blocks(pb.k_cache, pb.v_cache, pairs)


def test_dispatch_falls_back_to_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(ops, "available", lambda device: False)
    monkeypatch.setattr(attention, "reference_paged_attention", lambda *a: calls.append(a))
    pb = make_paged_batch([20], [1])
    attention.paged_attention(*pb.args(torch.empty_like(pb.query)))
    assert len(calls) == 1


def test_env_var_forces_the_reference(monkeypatch):
    monkeypatch.setenv(ops.ENV_DISABLE, "1")
    messages = []
    loader = ops.KernelLoader()
    loader.set_notify(messages.append)
    assert loader.load() is False
    assert not loader.available("cpu")
    assert loader.status() == f"reference: {ops.ENV_DISABLE} is set"
    assert messages == []


def test_env_var_picks_a_test_build_and_the_isa_follows(monkeypatch):
    """CHATPAGE_KERNEL_BUILD=avx2 makes a process an AVX2 machine's (its kernels' build and the
    cut-overs vector_isa() picks them by); a name that is no build is one line, and the
    reference runs."""
    native = ops.vector_isa()
    monkeypatch.setenv(ops.ENV_BUILD, "avx2")
    assert ops.vector_isa() == ("avx2" if native != "portable" else "portable")
    monkeypatch.setenv(ops.ENV_BUILD, "no-amx")
    assert ops.vector_isa() == ("avx512" if native == "amx" else native)
    monkeypatch.setenv(ops.ENV_BUILD, "avx3")
    messages = []
    loader = ops.KernelLoader()
    loader.set_notify(messages.append)
    assert loader.load() is False
    assert loader.status() == f"reference: {ops.ENV_BUILD}=avx3 is not one of avx2, no-amx"
    assert len(messages) == 1


BUILD_FAILURE_SCRIPT = """
import sys
from pathlib import Path
from chatpage.engine.model import ops

messages = []
loader = ops.KernelLoader(csrc=Path(sys.argv[1]), cache_dir=Path(sys.argv[2]))
loader.set_notify(messages.append)
print(loader.load(), loader.available("cpu"))
print(loader.status())
print(len(messages))
print(messages[0])
print(messages[-1])
"""


@pytest.mark.slow  # a (failing) build of the kernels in a process of its own
def test_build_error_falls_back_with_one_line(tmp_path):
    # in a fresh process: this one already holds the real library
    csrc = tmp_path / "csrc"
    (csrc / "cpu").mkdir(parents=True)
    (csrc / "ops.cpp").write_text('#include "no_such_header.h"\n')
    proc = subprocess.run(
        [sys.executable, "-c", BUILD_FAILURE_SCRIPT, str(csrc), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded, status, count, first, last = proc.stdout.splitlines()
    assert loaded == "False False"  # and no exception
    assert status.startswith("reference: build failed: ") and "no_such_header.h" in status
    assert (count, first) == ("2", ops.BUILD_MESSAGE)
    assert "using the torch reference" in last


def test_second_library_is_refused_not_fatal(tmp_path):
    # loading another TORCH_LIBRARY(chatpage) would abort the process; the loader declines instead
    assert ops.load()
    csrc = tmp_path / "csrc"
    (csrc / "cpu").mkdir(parents=True)
    (csrc / "ops.cpp").write_text("// another copy of the sources\n")
    messages = []
    loader = ops.KernelLoader(csrc=csrc, cache_dir=tmp_path / "cache")
    loader.set_notify(messages.append)
    assert loader.load() is False
    assert "already loaded" in loader.status()
    assert len(messages) == 1


def test_missing_sources_fall_back(tmp_path):
    messages = []
    loader = ops.KernelLoader(csrc=tmp_path / "nowhere")
    loader.set_notify(messages.append)
    assert loader.load() is False
    assert loader.status().startswith("reference: sources not found")
    assert len(messages) == 1


def test_cached_build_loads_without_compiling():
    assert ops.load()
    messages = []
    loader = ops.KernelLoader()
    loader.set_notify(messages.append)
    assert loader.load() and loader.status() == "native"
    assert messages == []  # the hashed library was found in the cache


def test_loading_is_once_and_thread_safe():
    import threading

    loader = ops.KernelLoader()
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(loader.available("cpu"))) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [True] * 4


def test_bench_case_reports_all_timings():
    from chatpage.bench import kernel

    case = kernel._case(1, 128, False, torch.device("cpu"), repeats=5, budget_s=0.1)
    assert case.keys() >= {
        "batch",
        "context",
        "paged_ms",
        "contiguous_sdpa_ms",
        "gather_sdpa_ms",
        "ratio_vs_contiguous",
        "speedup_vs_gather",
    }
    assert case["paged_ms"] > 0 and case["contiguous_sdpa_ms"] > 0 and case["gather_sdpa_ms"] > 0
    goals = kernel._goals([{**case, "batch": 32, "context": 512}])
    assert goals["ratio_vs_contiguous_b32_ctx512"] == case["ratio_vs_contiguous"]


def test_the_kernel_cache_can_live_outside_the_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv(ops.ENV_CACHE, raising=False)
    assert ops.cache_root() == tmp_path / "xdg" / "chatpage" / "torch_extensions"
    monkeypatch.setenv(ops.ENV_CACHE, str(tmp_path / "kernels"))
    assert ops.cache_root() == tmp_path / "kernels"
