"""Online serving (the paper's Figure 12): Poisson arrivals at a sweep of request rates.

Both systems are the same engine on the same model, trace and KV budget; only admission differs:

* chatpage: its own scheduler (blocks on demand, preemption when they run out);
* Oracle: admission limited by reservations of prompt + true output length per request
  (reservation.ReservationScheduler), like Orca (Oracle).

Time is a virtual clock: it advances by the measured time of every engine step (CPU time on one
thread, the default here, so other processes on a shared machine do not distort it; wall time
with more threads), and jumps over idle gaps to the next arrival (no sleeping; step costs are
real). Per rate and system the JSON
has the normalized latency (mean over requests of end-to-end latency / output tokens), TTFT and
TPOT percentiles. The sustainable rate is the highest rate whose normalized latency stays within
``--latency-bound`` (default: ``--latency-factor`` times chatpage's normalized latency at the
lowest rate), interpolated between the swept rates.

Both systems first run the whole trace at once (saturation): ``capacity_*_req_s`` is requests over
makespan, and the swept rates are multiples of chatpage's capacity, up to well past it, so the
knee where queueing takes over shows within a few dozen requests.
The KV budget is small on purpose so memory is the bottleneck, as in the paper.
"""

from __future__ import annotations

import argparse
import statistics
from collections import deque
from dataclasses import dataclass, replace

from chatpage.bench import common, plots
from chatpage.bench.reporting import Goal, Section, fmt, reader, table
from chatpage.bench.reservation import ReservationScheduler
from chatpage.bench.workloads import (
    SHAPES,
    BenchRequest,
    describe,
    make_trace,
    max_len_at,
    with_poisson_arrivals,
)
from chatpage.engine import SamplingParams

DEFAULT_SCALE = 0.2
REQUESTS_AT_SCALE_1 = 60  # 12 requests at the default scale
RATE_FRACTIONS = (0.5, 1.0, 2.0, 3.0)
LATENCY_FACTOR = 2.0
GOAL_RATE_RATIO = 2.0  # chatpage's sustainable rate over Oracle's (the paper's 2-4x)


def _engine(loaded, blocks: int, oracle: bool, reservations: dict[str, int]):
    eng = common.engine(loaded, blocks=blocks)
    if oracle:
        eng.scheduler = ReservationScheduler(eng.config, eng.bm, eng.stop, reservations)
    return eng


def replay(loaded, trace: list[BenchRequest], blocks: int, oracle: bool) -> dict:
    """Run ``trace`` (with arrival times) on a virtual clock; per-request latencies."""
    reservations = {f"r{i}": r.total_len for i, r in enumerate(trace)}
    eng = _engine(loaded, blocks, oracle, reservations)
    eng.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    log = common.record_batches(eng)
    pending = deque(enumerate(trace))
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    clock = 0.0
    while pending or eng.has_unfinished():
        if not eng.has_unfinished() and pending[0][1].arrival_s > clock:
            clock = pending[0][1].arrival_s  # idle: jump to the next arrival
        while pending and pending[0][1].arrival_s <= clock:
            i, r = pending.popleft()
            rid = f"r{i}"
            eng.add_request(
                r.prompt_ids,
                SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True),
                request_id=rid,
            )
            arrival[rid] = r.arrival_s
        t0 = common.now()
        outs = eng.step()
        clock += common.now() - t0
        for update in outs:
            if update.usage.completion_tokens:
                first.setdefault(update.request_id, clock)
            if update.finished:
                done[update.request_id] = clock
    stats = eng.stats()
    norm, ttft, tpot = [], [], []
    for i, r in enumerate(trace):
        rid = f"r{i}"
        e2e = done[rid] - arrival[rid]
        norm.append(e2e / r.output_len)
        ttft.append(first[rid] - arrival[rid])
        if r.output_len > 1:
            tpot.append((done[rid] - first[rid]) / (r.output_len - 1))
    batches = [n for n, _ in log]
    return {
        "normalized_latency_s": statistics.fmean(norm),
        "ttft_p50_s": common.percentile(ttft, 50),
        "ttft_p90_s": common.percentile(ttft, 90),
        "ttft_p99_s": common.percentile(ttft, 99),
        "tpot_p50_s": common.percentile(tpot, 50),
        "tpot_p90_s": common.percentile(tpot, 90),
        "tpot_p99_s": common.percentile(tpot, 99),
        "mean_batch": statistics.fmean(batches),
        "makespan_s": clock,
        "preemptions": stats.preemptions_recompute + stats.preemptions_swap,
    }


def sustainable_rate(points: list[tuple[float, float]], bound: float) -> tuple[float, str]:
    """Highest rate within ``bound`` from (rate, latency) points, linearly interpolated.

    Returns the rate and how it was found: "interpolated", "at least" (every rate passed) or
    "extrapolated" (even the lowest failed: its rate scaled by bound / latency).
    """
    points = sorted(points)
    prev = None
    for rate, lat in points:
        if lat > bound:
            if prev is None:
                return rate * bound / lat, "extrapolated"
            r0, l0 = prev
            return r0 + (rate - r0) * (bound - l0) / (lat - l0), "interpolated"
        prev = (rate, lat)
    return points[-1][0], "at least"


def _api(args, loaded) -> int:
    from chatpage.bench import serve_api

    trace = make_trace(
        SHAPES[args.workload],
        args.concurrency,
        scale=args.scale,
        seed=args.seed,
        vocab_size=loaded.config.vocab_size,
    )
    if args.output_tokens is not None:
        trace = [replace(r, output_len=args.output_tokens) for r in trace]
    result = {
        "benchmark": "serve_api",
        "workload": args.workload,
        "scale": args.scale,
        "seed": args.seed,
        **common.model_info(loaded),
        **describe(trace),
        **serve_api.run(args.model, trace, 512 << 20),
    }
    return common.emit(common.round_floats(result), args.json)


def _parser() -> argparse.ArgumentParser:
    p = common.parser("serve", "Poisson arrivals: chatpage vs Oracle reservations", DEFAULT_SCALE)
    p.add_argument("--workload", choices=sorted(SHAPES), default="sharegpt")
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"requests per rate (default {REQUESTS_AT_SCALE_1} x scale, at least 6)",
    )
    p.add_argument(
        "--kv-blocks",
        type=int,
        default=None,
        help="KV budget in blocks (default: the longest sequence the trace allows)",
    )
    p.add_argument(
        "--rates",
        default=None,
        help="comma-separated request rates (default: fractions "
        f"{RATE_FRACTIONS} of chatpage's measured capacity)",
    )
    p.add_argument(
        "--latency-bound", type=float, default=None, help="normalized latency bound in s/token"
    )
    p.add_argument(
        "--latency-factor",
        type=float,
        default=LATENCY_FACTOR,
        help="bound = this x chatpage's normalized latency at the lowest rate",
    )
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    p.add_argument(
        "--api",
        action="store_true",
        help="through chatpage serve's HTTP API instead (see bench/serve_api.py)",
    )
    p.add_argument(
        "--concurrency", type=int, default=32, help="with --api: streams at once (default 32)"
    )
    p.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="with --api: every request decodes this many tokens (default: the trace's lengths)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = common.parse(p, argv)
    if args.concurrency < 1:
        p.error(f"--concurrency must be >= 1, got {args.concurrency}")
    if args.output_tokens is not None and args.output_tokens < 1:
        p.error(f"--output-tokens must be >= 1, got {args.output_tokens}")
    n = args.requests or max(6, round(REQUESTS_AT_SCALE_1 * args.scale))

    loaded = common.load(args.model)
    if args.api:
        return _api(args, loaded)
    base = make_trace(
        SHAPES[args.workload],
        n,
        scale=args.scale,
        seed=args.seed,
        vocab_size=loaded.config.vocab_size,
    )
    shape = describe(base)
    longest_blocks = -(-max(max_len_at(args.scale), shape["longest"]) // 16)
    blocks = args.kv_blocks or longest_blocks
    common.say(f"trace: {shape}; {blocks} KV blocks")

    capacity = {}
    for system in ("chatpage", "oracle"):
        common.say(f"{system}: capacity (the whole trace at once)")
        burst = replay(loaded, base, blocks, oracle=system == "oracle")
        capacity[system] = n / burst["makespan_s"]
    if args.rates:
        rates = [float(x) for x in args.rates.split(",")]
    else:
        rates = [round(f * capacity["chatpage"], 4) for f in RATE_FRACTIONS]
    common.say(f"capacity {capacity}; rates {rates}")

    rows = []
    for rate in rates:
        trace = with_poisson_arrivals(base, rate, seed=args.seed)
        for system in ("chatpage", "oracle"):
            res = replay(loaded, trace, blocks, oracle=system == "oracle")
            common.say(
                f"rate {rate}: {system} normalized latency "
                f"{res['normalized_latency_s']:.3f} s/token, mean batch {res['mean_batch']:.1f}"
            )
            rows.append({"rate": rate, "system": system, **res})

    lowest = min(rates)
    base_latency = next(
        r["normalized_latency_s"] for r in rows if r["rate"] == lowest and r["system"] == "chatpage"
    )
    bound = args.latency_bound or args.latency_factor * base_latency
    found = {}
    for system in ("chatpage", "oracle"):
        found[system] = sustainable_rate(
            [(r["rate"], r["normalized_latency_s"]) for r in rows if r["system"] == system], bound
        )
    result = {
        "benchmark": "serve",
        "workload": args.workload,
        "scale": args.scale,
        "seed": args.seed,
        **common.model_info(loaded),
        **shape,
        "kv_blocks": blocks,
        "capacity_chatpage_req_s": capacity["chatpage"],
        "capacity_oracle_req_s": capacity["oracle"],
        "capacity_ratio": capacity["chatpage"] / capacity["oracle"],
        "latency_bound_s": bound,
        "rates": rows,
        "sustainable_rate_chatpage": found["chatpage"][0],
        "sustainable_rate_chatpage_how": found["chatpage"][1],
        "sustainable_rate_oracle": found["oracle"][0],
        "sustainable_rate_oracle_how": found["oracle"][1],
        "rate_ratio": found["chatpage"][0] / found["oracle"][0] if found["oracle"][0] else None,
        "goal_rate_ratio": GOAL_RATE_RATIO,
    }
    if args.plot:
        result["plot"] = plots.serve(result, args.plot)
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RatePoint:
    """One system at one request rate."""

    rate: float
    system: str
    normalized_latency_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    mean_batch: float
    preemptions: int


@dataclass(frozen=True)
class ServeResult:
    """What the report reads of a run's JSON."""

    requests: int
    workload: str
    scale: float
    kv_blocks: int
    latency_bound_s: float
    rates: list[RatePoint]
    capacity_chatpage_req_s: float
    capacity_oracle_req_s: float
    capacity_ratio: float
    sustainable_rate_chatpage: float
    sustainable_rate_chatpage_how: str
    sustainable_rate_oracle: float
    sustainable_rate_oracle_how: str
    rate_ratio: float | None


def goals(s: ServeResult) -> list[Goal]:
    r = s.rate_ratio
    return [
        Goal(
            "serve",
            "sustainable rate chatpage / Oracle",
            r,
            f">= {GOAL_RATE_RATIO:g}",
            r is not None and r >= GOAL_RATE_RATIO and s.sustainable_rate_oracle_how != "at least",
            _why(s),
        )
    ]


def _why(s: ServeResult) -> str:
    top = max(x.rate for x in s.rates)
    at = {r.system: r for r in s.rates if r.rate == top}
    c, o = at["chatpage"], at["oracle"]
    text = (
        f"with {s.kv_blocks} KV blocks chatpage batches more at the highest rate "
        f"({c.mean_batch:.1f} vs {o.mean_batch:.1f}) and starts requests sooner "
        f"(TTFT p50 {c.ttft_p50_s:.2f} vs {o.ttft_p50_s:.2f} s), but on this CPU a "
        f"step's time grows with every sequence in it (matmuls are compute-bound from ~4 "
        f"rows), so TPOT rises with the batch ({c.tpot_p50_s * 1e3:.0f} vs "
        f"{o.tpot_p50_s * 1e3:.0f} ms) and recompute preemptions "
        f"({c.preemptions}) cost steps; saturated capacities differ by "
        f"{s.capacity_ratio:.2f}x. On a GPU a decode step costs about the same for 2 or "
        "20 sequences, which is what turns the paper's larger batches into 2-4x the rate"
    )
    if "at least" in (s.sustainable_rate_oracle_how, s.sustainable_rate_chatpage_how):
        text += (
            "; a system stayed under the bound at every swept rate, so its rate is a lower bound"
        )
    return text


def figures(r: ServeResult) -> list[str]:
    rows = [
        [
            x.rate,
            x.system,
            x.normalized_latency_s,
            x.ttft_p50_s,
            x.ttft_p99_s,
            x.tpot_p50_s,
            x.tpot_p99_s,
            x.mean_batch,
        ]
        for x in r.rates
    ]
    header = ["rate (req/s)", "system", "normalized latency (s/tok)", "TTFT p50", "TTFT p99"]
    return [
        f"{r.requests} {r.workload}-shaped requests per rate at scale {r.scale}, "
        f"{r.kv_blocks} KV blocks, latency bound {r.latency_bound_s:.3f} s/token.",
        "",
        table([*header, "TPOT p50", "TPOT p99", "mean batch"], rows),
        "",
        f"Saturated capacity (whole trace at once): chatpage "
        f"{r.capacity_chatpage_req_s:.3f} req/s, Oracle {r.capacity_oracle_req_s:.3f} "
        f"req/s. Sustainable rate: chatpage {r.sustainable_rate_chatpage:.3f} "
        f"({r.sustainable_rate_chatpage_how}), Oracle "
        f"{r.sustainable_rate_oracle:.3f} ({r.sustainable_rate_oracle_how}); "
        f"ratio **{fmt(r.rate_ratio)}x**.",
    ]


SECTION = Section(reader(ServeResult), goals, figures, plotted=True)
