"""`chatpage bench startup`: a cached start of the TUI to model ready, in every weight format.

Each start is a fresh process running ``chatpage bench ui --startup-only`` (the real app,
headless): from process start (interpreter and imports included) to Textual's first paint and to
the engine reporting ready, with the weights already packed in the cache (one unmeasured start
per format first makes sure they are). ``--repeats`` rounds, each starting every format once, so
a slow minute on a shared machine lands on every format alike; each format reports its median
and its slowest start.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_most, listed, reader, table
from chatpage.bench.ui import GOAL_MODEL_READY_S
from chatpage.vocab import WEIGHT_FORMATS


def start(fmt: str, args) -> dict:
    """One cached start in a fresh process: its first-paint and model-ready times."""
    cmd = [sys.executable, "-m", "chatpage.bench.ui", "--startup-only", "--json", "--weights", fmt]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        lines = (done.stderr.strip() or "no output").splitlines()
        why = lines[-1].removeprefix("chatpage: error: ")
        raise SystemExit(f"chatpage: error: the {fmt} start failed: {why}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    for fmt in args.weights:
        common.say(f"{fmt}: a first start packs the weights if the cache lacks them")
        start(fmt, args)
    starts: dict[str, list[dict]] = {fmt: [] for fmt in args.weights}
    for r in range(args.repeats):
        common.say(f"round {r + 1}/{args.repeats}")
        for fmt in args.weights:
            starts[fmt].append(start(fmt, args))
    rows = []
    for fmt, runs in starts.items():
        ready = [x["model_ready_s"] for x in runs]
        rows.append(
            {
                "weights": fmt,
                "model_ready_s": statistics.median(ready),
                "slowest_model_ready_s": max(ready),
                "first_paint_s": statistics.median(x["first_paint_s"] for x in runs),
                "starts_s": ready,
                "threads": runs[0]["threads"],
            }
        )
    return {
        "benchmark": "startup",
        "model": args.model or "default",
        "rounds": args.repeats,
        "results": rows,
        "slowest_format_median_s": max(r["model_ready_s"] for r in rows),
        "goals": {"model_ready_s": GOAL_MODEL_READY_S},
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser("startup", __doc__.splitlines()[0], default_scale=1.0)
    p.add_argument(
        "--weights",
        type=common.weight_formats,
        default=list(WEIGHT_FORMATS),
        help="comma-separated weight formats (default: all)",
    )
    p.add_argument("--repeats", type=int, default=3, help="rounds of one start per format")
    args = common.parse(p, argv)
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    return common.emit(common.round_floats(run(args)), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormatStarts:
    weights: str
    model_ready_s: float
    slowest_model_ready_s: float
    first_paint_s: float
    starts_s: list[float]
    threads: int


@dataclass(frozen=True)
class StartupResult:
    """What the report reads of a run's JSON."""

    rounds: int
    results: list[FormatStarts]


def goals(st: StartupResult) -> list[Goal]:
    return [
        at_most(
            "startup",
            f"cached start to model ready, {r.weights}",
            r.model_ready_s,
            GOAL_MODEL_READY_S,
            f"the median of {st.rounds} starts in fresh processes, the formats taking "
            f"turns ({listed(r.starts_s)} s; first paint "
            f"{r.first_paint_s:.2f} s): the real app from process start to the engine ready",
            unit=" s",
        )
        for r in st.results
    ]


def figures(r: StartupResult) -> list[str]:
    rows = [
        [x.weights, x.model_ready_s, x.slowest_model_ready_s, x.first_paint_s] for x in r.results
    ]
    return [
        f"A cached start of the TUI in each weight format, {r.rounds} rounds of fresh "
        f"processes, {r.results[0].threads} engine thread(s).",
        "",
        table(
            ["weights", "model ready, median (s)", "slowest (s)", "first paint, median (s)"], rows
        ),
    ]


SECTION = Section(reader(StartupResult), goals, figures)


if __name__ == "__main__":
    raise SystemExit(main())
