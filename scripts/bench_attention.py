"""Paged attention alone: the figures of docs/kernels.md's int8 KV cache section.

    .venv/bin/python scripts/bench_attention.py ROWS CONTEXT {bf16,int8} [--threads 1] [--seq]

times ``torch.ops.chatpage.paged_attention`` for ROWS decode rows (one sequence each) over
CONTEXT keys, through 30 layers' caches of the default model's attention shape (9 query heads, 3
KV heads of 64, blocks of 16 tokens), every sequence's blocks scattered over the pool as a
running engine leaves them (``--seq``: in order); the best of ``--repeats`` passes, wall time, and
the KV bytes read a second.
"""

from __future__ import annotations

import argparse
import time

import torch

from chatpage.engine.model import ops
from chatpage.engine.model.attention import quantize_kv

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", type=int)
    p.add_argument("context", type=int)
    p.add_argument("kv", choices=["bf16", "int8"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seq", action="store_true", help="each sequence's blocks in order")
    args = p.parse_args()
    if not ops.load():
        raise SystemExit(f"the native kernels did not load: {ops.status()}")
    torch.set_num_threads(args.threads)
    per_seq = -(-args.context // BLOCK)
    blocks = args.rows * per_seq
    g = torch.Generator().manual_seed(0)
    caches = []
    for _ in range(LAYERS):
        k, v = (torch.randn(blocks, BLOCK, KV_HEADS, HEAD_DIM, generator=g) for _ in "kv")
        caches.append(
            (quantize_kv(k), quantize_kv(v)) if args.kv == "int8" else (k.bfloat16(), v.bfloat16())
        )
    order = torch.arange(blocks) if args.seq else torch.randperm(blocks, generator=g)
    tables = order.int().view(args.rows, per_seq).contiguous()
    seq_lens = torch.full((args.rows,), args.context, dtype=torch.int32)
    starts = torch.arange(args.rows + 1, dtype=torch.int32)
    query = torch.randn(args.rows, Q_HEADS, HEAD_DIM, generator=g)
    out = torch.empty_like(query)

    def layers() -> None:
        for k, v in caches:
            torch.ops.chatpage.paged_attention(
                out, query, k, v, tables, seq_lens, starts, HEAD_DIM**-0.5, 0
            )

    layers()
    best = float("inf")
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        layers()
        best = min(best, time.perf_counter() - t0)
    read = sum(k.nbytes + v.nbytes for k, v in caches)
    print(
        f"{args.rows} rows x {args.context} keys, {args.kv} KV, {args.threads} thread(s): "
        f"{best * 1e3:.2f} ms for {LAYERS} layers, {read / best / 1e9:.1f} GB/s of KV"
    )


if __name__ == "__main__":
    main()
