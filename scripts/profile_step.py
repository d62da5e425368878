"""A decode step of many rows, per op: the table of docs/kernels.md ("A decode step of 32 and 64
rows, per op").

    .venv/bin/python scripts/profile_step.py [--rows 32,64] [--context 320] [--threads 1]

runs the default model in int4 (the app's default format) with its native kernels, and measures
at each row count, in one process, 1 thread by default, process time (median of the repeats):
the whole decode step of that many sequences (``bench throughput``'s ``decode_step_ms``, the
native decode loop); the same step's ops, each call timed, over the step without the native
loop (each kernel alone: matmuls by kernel, attention, the KV write, the fused norms, RoPE and
SiLU, sampling), so that that step less its ops is the Python and the engine's bookkeeping; the
model's matmuls in fp32 through torch (oneDNN / MKL sgemm); and the machine's limits for the
step's matmuls: the int4 weights read at the measured read bandwidth, and the multiply-adds at
the rate of a large square sgemm. For an AVX2 machine's figures on an AVX-512 one, run it with
``CHATPAGE_KERNEL_BUILD=avx2 DNNL_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
ATEN_CPU_CAPABILITY=avx2`` (chatpage's AVX2 build, torch's kernels held to AVX2 too).
"""

from __future__ import annotations

import argparse
import collections
import json
import time

import torch

from chatpage.bench import common, throughput
from chatpage.engine.model import ops
from chatpage.engine.sampling_params import SamplingParams

# the native ops of a step, by the row of the table they fall in
GROUPS = {
    "gemm_q8_int4_packed": "matmuls, int4 (q8 packs)",
    "gemm_int4": "matmuls, int4 (GEMM)",
    "gemv_int4": "matmuls, int4 (GEMV)",
    "gemm_q8_int8_packed": "lm_head, int8 (q8 pack)",
    "gemm_int8": "lm_head, int8 (GEMM)",
    "gemv_int8": "lm_head, int8 (GEMV)",
    "paged_attention": "attention",
    "write_kv": "KV write",
    "add_rms_norm": "norms (add + RMSNorm)",
    "rope_qkv": "RoPE",
    "silu_mul": "SiLU-mul",
    "sample_rows": "sampling",
}


def engine(loaded, rows: int, context: int):
    blocks = rows * (-(-(context + 32) // 16)) + 64  # every sequence's whole context at once
    return common.engine(loaded, weight_dtype="int4", max_num_seqs=rows, blocks=blocks)


def add_requests(eng, rows: int, context: int, new_tokens: int) -> None:
    for i in range(rows):
        prompt = [100 + (i * 7 + j) % 40000 for j in range(context)]
        eng.add_request(
            prompt, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        )


def ops_ms(loaded, rows: int, context: int) -> dict[str, float]:
    """ms per decode step of ``rows`` sequences in each op group (:data:`GROUPS`), the step run
    without the native loop so that each kernel is called from Python, where each call is timed
    (process time on one thread)."""
    lib = torch.ops.chatpage
    spent: dict[str, float] = collections.defaultdict(float)
    counting = [False]

    def timed(name: str, op):
        def call(*args):
            t0 = common.now()
            out = op(*args)
            if counting[0]:
                spent[GROUPS[name]] += common.now() - t0
            return out

        return call

    originals = {name: getattr(lib, name) for name in GROUPS}
    for name, op in originals.items():  # before the engine binds them
        setattr(lib, name, timed(name, op))
    try:
        eng = engine(loaded, rows, context)
        eng.model.native_layers = None
        add_requests(eng, rows, context, 64)
        log = common.record_batches(eng)
        while not (log and tuple(log[-1]) == (rows, rows)):  # to the first decode step
            eng.step()
        counting[0], steps = True, 8
        t0 = common.now()
        for _ in range(steps):
            eng.step()
        spent["step (the Python loop)"] = common.now() - t0
        counting[0] = False
        while eng.has_unfinished():
            eng.step()
    finally:
        for name, op in originals.items():
            setattr(lib, name, op)
    return {group: seconds * 1e3 / steps for group, seconds in spent.items()}


def shapes(model) -> list[tuple[int, int]]:
    """(outputs, inputs) of the step's matmuls: every layer's and the lm_head."""
    linears = [f for layer in model.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    linears.append(model.lm_head)
    one = {k: torch.zeros(1, k, dtype=model.mm_dtype) for k in {f.in_features for f in linears}}
    return [(f(one[f.in_features]).shape[-1], f.in_features) for f in linears]


def fp32_matmuls_ms(model, rows: int) -> float:
    """The step's matmuls (the 30 layers and the lm_head) in fp32 through torch's F.linear."""
    weights = [torch.randn(n, k) / 24 for n, k in shapes(model)]
    xs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}

    def step() -> None:
        for w in weights:
            torch.nn.functional.linear(xs[w.shape[1]], w)

    return common.median_s(step, repeats=5, warmup=1) * 1e3


def macs_per_row(model) -> int:
    return sum(n * k for n, k in shapes(model))


def sgemm_macs_per_s(n: int = 1536) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    return n**3 / common.median_s(lambda: a @ b, repeats=5, warmup=1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="32,64")
    p.add_argument("--context", type=int, default=320, help="tokens of context per sequence")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = common.load(args.model)
    out: dict = {
        "vector_isa": ops.vector_isa(),
        "clock": common.clock_name(),
        "threads": args.threads,
        "context": args.context,
    }
    with torch.inference_mode():
        probe = engine(loaded, 8, args.context)
        model = probe.model
        out["read_gb_s"] = throughput.read_bandwidth() / 1e9
        out["sgemm_gmac_s"] = sgemm_macs_per_s() / 1e9
        out["weight_mb"] = model.weight_bytes / 1e6
        out["macs_per_row_m"] = macs_per_row(model) / 1e6
        for rows in (int(r) for r in args.rows.split(",")):
            t0 = time.perf_counter()
            step = throughput.decode_step_ms(
                engine(loaded, rows, args.context), rows, args.context, 48
            )
            by_op = ops_ms(loaded, rows, args.context)
            python_step = by_op.pop("step (the Python loop)")
            out[str(rows)] = {
                "step_ms": step,
                "python_step_ms": python_step,
                "ops_ms": by_op,
                "rest_ms": python_step - sum(by_op.values()),
                "fp32_matmuls_ms": fp32_matmuls_ms(model, rows),
                "read_floor_ms": out["weight_mb"] / out["read_gb_s"],
                "fma_floor_ms": out["macs_per_row_m"] * rows / out["sgemm_gmac_s"],
                "seconds": time.perf_counter() - t0,
            }
            print(json.dumps({str(rows): out[str(rows)]}), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
