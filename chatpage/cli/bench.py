"""`chatpage bench NAME ...`: each benchmark module parses its own arguments."""

from __future__ import annotations

import argparse
import importlib

BENCHES = (
    "kernel",
    "throughput",
    "memory",
    "serve",
    "prefix",
    "sharing",
    "ui",
    "startup",
    "single",
    "quality",
    "soak",
    "peers",
    "structured",
    "load",
    "gpu",
    "windows",
    "kv",
    "resume",
    "spec",
)


def cmd_bench(args) -> int:
    module = importlib.import_module(f"chatpage.bench.{args.which}")
    return module.main(args.rest)


def register(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser(
        "bench", help="benchmarks (readable text; --json: one JSON line on stdout)", add_help=False
    )
    bench.add_argument("which", choices=BENCHES)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
