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

from chatpage.bench import common
from chatpage.vocab import WEIGHT_FORMATS

GOAL_S = 3.0


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
        "goals": {"model_ready_s": GOAL_S},
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


if __name__ == "__main__":
    raise SystemExit(main())
