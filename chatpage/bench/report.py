"""Run every benchmark with the default model and write docs/benchmarks.md (``make bench``).

Each benchmark runs in its own process (``python -m chatpage.cli bench NAME --json ...``), so one
model's memory never weighs on the next; the last stdout line of each is its JSON result.

    python -m chatpage.bench.report docs/benchmarks.md                # run all, write the report
    python -m chatpage.bench.report OUT.md --only memory,prefix       # a subset
    python -m chatpage.bench.report OUT.md --save runs.json           # keep the raw results
    python -m chatpage.bench.report OUT.md --results runs.json        # re-render, run nothing
    python -m chatpage.bench.report OUT.md --results runs.json --only serve --save runs.json
    python -m chatpage.bench.report docs/benchmarks.md --only soak      # rerun one, keep the rest

    python -m chatpage.bench.report docs/benchmarks.md --only peers     # against vLLM (~20 min)

With ``--only`` and no ``--results``, the sections it names (and their goal rows) are rerun and
replaced, and the rest of the report being rewritten stays as it is, hand-written notes and
sections with no JSON included (:func:`splice`), so one benchmark can be rerun without the others.
A full run runs every benchmark but ``peers`` (``make bench-peers``) and keeps that one's last figures.
    python -m chatpage.bench.report OUT.md --bench-args "--model DIR" # passed to every bench
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chatpage.bench import (
    kernel,
    kv,
    load,
    memory,
    peers,
    prefix,
    quality,
    resume,
    serve,
    serve_api,
    sharing,
    single,
    soak,
    spec,
    startup,
    structured,
    throughput,
    ui,
    windows,
)
from chatpage.bench.reporting import Goal, Section, table

# One torch thread and the CPU-time clock (bench/common.now): on a shared 2-core machine, two
# OpenMP threads collapse whenever another process runs, and wall times swing by 2-10x.
DEFAULT_BENCH_ARGS = "--threads 1"
# Every benchmark the report runs, in the order of its sections and goals: each module declares
# how it runs and renders (its SECTION: chatpage/bench/reporting.py).
REGISTRY: dict[str, Section[Any]] = {
    "single": single.SECTION,
    "quality": quality.SECTION,
    "ui": ui.SECTION,
    "startup": startup.SECTION,
    "throughput": throughput.SECTION,
    "memory": memory.SECTION,
    "windows": windows.SECTION,
    "kv": kv.SECTION,
    "spec": spec.SECTION,
    "serve": serve.SECTION,
    "serve_api": serve_api.SECTION,
    "prefix": prefix.SECTION,
    "resume": resume.SECTION,
    "sharing": sharing.SECTION,
    "structured": structured.SECTION,
    "soak": soak.SECTION,
    "kernel": kernel.SECTION,
    "load": load.SECTION,
    "peers": peers.SECTION,
    "peers_qwen05": peers.SECTION_QWEN05,
    "peers_int8_kv": peers.SECTION_INT8_KV,
    "peers_tier": peers.SECTION_TIER,
}
ORDER = tuple(REGISTRY)
NAMED_ONLY = tuple(name for name, s in REGISTRY.items() if s.named_only)


def command(name: str, plot_dir: Path, extra: list[str]) -> list[str]:
    """The command line that runs benchmark ``name``."""
    section = REGISTRY[name]
    words = list(section.command or (name,))
    cmd = [sys.executable, "-m", "chatpage.cli", "bench", *words, "--json"]
    if section.plotted:
        cmd += ["--plot", str(plot_dir / f"bench-{name}.png")]
    return cmd + list(section.args) + ([] if section.own_args else extra)


def run_one(name: str, plot_dir: Path, extra: list[str]) -> dict[str, Any]:
    cmd = command(name, plot_dir, extra)
    print(f"== {shlex.join(cmd[2:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    entry: dict[str, Any] = {
        "command": "chatpage " + shlex.join(cmd[3:]),
        "seconds": round(seconds, 1),
        "returncode": proc.returncode,
    }
    try:
        entry["result"] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        entry["error"] = f"no JSON on the last stdout line (exit status {proc.returncode})"
    return entry


def goals(results: dict[str, Any]) -> list[Goal]:
    """Every goal with its figure, target and whether it was met, benchmark by benchmark."""
    return [
        g
        for name, section in REGISTRY.items()
        if results.get(name)
        for g in section.goals(section.read(results[name]))
    ]


def _section(name: str, entry: dict[str, Any], report_dir: Path) -> list[str]:
    lines = [f"## {name}", "", f"`{entry['command']}` ({entry['seconds']:.0f} s)", ""]
    if "error" in entry:
        return lines + [f"**Failed:** {entry['error']}", ""]
    r = entry["result"]
    if r.get("vector_isa"):  # the CPU's vector paths the run took (a report can mix machines)
        lines += [f"Kernels: {r['vector_isa']}.", ""]
    section = REGISTRY[name]
    lines += section.figures(section.read(r)) + [""]
    plot = r.get("plot")
    if plot:
        rel = os.path.relpath(plot, report_dir)
        lines += [f"![{name}]({rel})", ""]
    lines += [
        "<details><summary>JSON</summary>",
        "",
        "```json",
        json.dumps(r, indent=1),
        "```",
        "",
        "</details>",
        "",
    ]
    return lines


def _machine() -> str:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from chatpage.engine.model import ops

    return (
        f"{cpu} ({ops.vector_isa()} kernels), {os.cpu_count()} cores, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}"
    )


GPU_NOTE = (
    "**GPU: the GPU path has not yet run on a GPU.** Every figure here is the CPU's. "
    "`--device cuda` and `scripts/gpu_check.sh` (the CUDA kernels, tests/gpu, paged vs "
    "contiguous attention, decode tok/s against transformers, CUDA graphs on and off, "
    "greedy equivalence with the CPU) are built and tested on the CPU only; no GPU figure "
    "is written until that script's JSON, measured on a GPU, replaces this line."
)


def _setting(bench_args: str) -> str:
    text = f"Every benchmark but kernel and windows ran with `{bench_args or '(no arguments)'}`"
    if "--threads 1" in bench_args:
        text += (
            ": on a shared 2-core machine two OpenMP threads collapse whenever another "
            "process runs (wall times swing 2-10x), so the benchmarks use one thread and time "
            "it by the process's CPU time (`chatpage/bench/common.py: now`), which other "
            "processes do not inflate"
        )
    return (
        text
        + ". Both sides of every comparison run under the same setting; step times are medians."
    )


def _goals_table(results: dict[str, Any]) -> str:
    rows = [
        [g.bench, g.goal, g.value, g.target, "met" if g.met else "**missed**", g.why]
        for g in goals(results)
    ]
    return table(["bench", "goal", "figure", "target", "status", "why"], rows)


def render(runs: dict, report: Path, machine: str, total_s: float, bench_args: str = "") -> str:
    results = {k: v["result"] for k, v in runs.items() if "result" in v}
    lines = [
        "# Benchmarks",
        "",
        "Written by `make bench` (`python -m chatpage.bench.report docs/benchmarks.md`); "
        "every figure below comes from the JSON each command printed, on the default model "
        "(SmolLM2-135M-Instruct), in fp32 weights unless a row names a weight format "
        "(`--weights`: bf16, int8, int4; the app's default is int4).",
        "",
        f"Machine: {machine}. The benchmarks took {total_s / 60:.1f} min in all. "
        "Sections rerun alone (`--only`) may come from another machine of the same kind: each "
        "says which kernels it ran where it recorded them (the machines change between AVX-512 "
        "and AVX2).",
        "",
        _setting(bench_args),
        "",
        GPU_NOTE,
        "",
        "## Goals",
        "",
    ]
    lines += [_goals_table(results), ""]
    for name in ORDER:
        if name in runs:
            lines += _section(name, runs[name], report.parent)
    return "\n".join(lines) + "\n"


_SECTION = re.compile(
    r"^## (?P<name>\S+)\n\n`(?P<command>[^`]+)` \((?P<seconds>[0-9.]+) s\)\n"
    r"(?:(?!^## ).*\n)*?```json\n(?P<json>(?:(?!^```$).*\n)*)^```$",
    re.MULTILINE,
)
_MACHINE = re.compile(r"^Machine: (?P<machine>.*)\. The benchmarks took", re.MULTILINE)


def read_back(text: str) -> tuple[dict, str | None]:
    """The runs and machine line of a report this module wrote (its sections' JSON blocks)."""
    runs = {
        m["name"]: {
            "command": m["command"],
            "seconds": float(m["seconds"]),
            "returncode": 0,
            "result": json.loads(m["json"]),
        }
        for m in _SECTION.finditer(text)
        if m["name"] in ORDER
    }
    machine = _MACHINE.search(text)
    return runs, machine["machine"] if machine else None


def _blocks(text: str) -> list[tuple[str, str]]:
    """``text`` cut at its ``## `` headings: (name, the block's text), the part before the first
    heading named ""."""
    parts = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    return [(p[3:].split("\n", 1)[0].strip() if p.startswith("## ") else "", p) for p in parts]


def splice(old: str, new: str, rerun: list[str]) -> str:
    """The report ``old`` with the sections named in ``rerun`` and their goal rows taken from
    ``new`` (a render of those runs alone): every other section and goal row is kept as it was, hand
    written notes and the sections `read_back` cannot read included. A section new to the report
    goes where the registry's order puts it; a rerun section's goal rows (those whose bench column
    its new rows name) take the place of its old ones, or end the table."""
    fresh = dict(_blocks(new))
    blocks = [(n, fresh[n] if n in rerun and n in fresh else b) for n, b in _blocks(old)]
    for name in rerun:
        if name in fresh and all(n != name for n, _ in blocks):
            later = set(ORDER[ORDER.index(name) + 1 :]) if name in ORDER else set()
            at = next((i for i, (n, _) in enumerate(blocks) if n in later), len(blocks))
            blocks.insert(at, (name, fresh[name]))
    rows = _goal_rows(fresh.get("Goals", ""))
    return "".join(
        _with_rows(block, rows) if name == "Goals" and rows else block for name, block in blocks
    )


ROWS_FROM = 4  # a Goals block's lines before its table rows: heading, blank, header, separator


def _goal_rows(block: str) -> list[str]:
    return [ln for ln in block.splitlines()[ROWS_FROM:] if ln.startswith("| ")]


def _with_rows(block: str, rows: list[str]) -> str:
    """The Goals block ``block`` with ``rows`` in the place of the rows of their benches (the
    first column), or after its last row."""
    benches = {ln.split(" | ")[0][2:] for ln in rows}
    lines = block.split("\n")
    mine = [i for i, ln in enumerate(lines) if ln.startswith("| ") and i >= ROWS_FROM]
    stale = [i for i in mine if lines[i].split(" | ")[0][2:] in benches]
    at = stale[0] if stale else (mine[-1] + 1 if mine else len(lines))
    lines = [ln for i, ln in enumerate(lines) if i not in stale]
    lines[at:at] = rows
    return "\n".join(lines)


def kept(back: dict, only: str | None) -> dict:
    """The runs read back from the report being rewritten that the new one keeps: all of them
    when only some benchmarks rerun (``--only``), else those a full run leaves out
    (:data:`NAMED_ONLY`)."""
    return dict(back) if only else {n: back[n] for n in NAMED_ONLY if n in back}


def to_run(only: str | None, from_results: bool) -> list[str]:
    """The benchmarks to run: those ``--only`` names, else none on top of saved results, else
    every one but :data:`NAMED_ONLY`."""
    if only is None:
        return [] if from_results else [n for n in ORDER if n not in NAMED_ONLY]
    return [n for n in (x.strip() for x in only.split(",")) if n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m chatpage.bench.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("report", type=Path, help="the Markdown file to write")
    p.add_argument(
        "--only",
        default=None,
        help="benchmarks to run, comma-separated (default: all; none with --results)",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="start from these saved results (rerun only what --only names)",
    )
    p.add_argument("--save", type=Path, default=None, help="also write the raw results here")
    p.add_argument(
        "--bench-args",
        default=DEFAULT_BENCH_ARGS,
        help="arguments for every benchmark but kernel and windows (default %(default)r)",
    )
    args = p.parse_args(argv)
    runs: dict = {}
    machine = None
    old: str | None = None  # the report being rewritten, when it is read back
    if args.results:
        saved = json.loads(args.results.read_text())
        runs, machine = saved["runs"], saved["machine"]
        args.bench_args = saved.get("bench_args", args.bench_args)
    elif args.report.exists():
        old = args.report.read_text(encoding="utf-8")
        back, machine = read_back(old)
        runs = kept(back, args.only)
        machine = machine if args.only else None
    names = to_run(args.only, bool(args.results))
    for name in names:
        if name not in ORDER:
            p.error(f"unknown benchmark {name!r}; choose from {', '.join(ORDER)}")
    extra = shlex.split(args.bench_args)
    plot_dir = args.report.parent
    plot_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        runs[name] = run_one(name, plot_dir, extra)
    if names or machine is None:
        machine = _machine()
    total = sum(e["seconds"] for e in runs.values())
    if args.save:
        args.save.write_text(
            json.dumps({"runs": runs, "machine": machine, "bench_args": args.bench_args}, indent=1)
        )
    if old is not None and args.only:  # some benchmarks rerun: the rest of the report as it was
        rerun = {name: runs[name] for name in names}
        text = splice(old, render(rerun, args.report, machine, total, args.bench_args), names)
    else:
        text = render(runs, args.report, machine, total, args.bench_args)
    args.report.write_text(text)
    print(f"wrote {args.report}", file=sys.stderr)
    return 0 if all("result" in e for e in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
