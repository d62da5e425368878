"""Memory saved by sharing KV blocks (the paper's Figure 15), and beam search's throughput.

For parallel sampling (n = 2, 4, 6; temperature 1) and beam search (width 2, 4, 6), a small trace
runs on the engine with EOS ignored; after every step the engine's own counters give

    saving = 1 - physical / logical,  physical = blocks_used - blocks_pinned,
                                       logical  = stats.logical_blocks (sum of block tables),

time-averaged as 1 - sum(physical) / sum(logical) over the steps.

Scaling: ShareGPT-shaped lengths are multiplied by ``--scale`` (default 0.25: mean input 40,
output 84); Alpaca-shaped lengths, already short, by min(1, 4 x scale) (full size by default).

Throughput: beam width 4 against four independent requests of the same prompt (sampled with
different seeds), both producing four sequences per prompt, on the ShareGPT-shaped trace.
"""

from __future__ import annotations

import time

from chatpage.bench import common, plots
from chatpage.bench.workloads import ALPACA, SHAREGPT, describe, make_trace
from chatpage.engine import SamplingParams

DEFAULT_SCALE = 0.25
WIDTHS = (2, 4, 6)
REQUESTS = {"alpaca": 8, "sharegpt": 4}


def measure_saving(eng, trace, params_for) -> dict:
    """Run ``trace`` with ``params_for(request, index)``; time-averaged saving and wall time."""
    physical = logical = 0

    def on_step(e, _outs) -> None:
        nonlocal physical, logical
        s = e.stats()
        physical += s.blocks_used - s.blocks_pinned
        logical += s.logical_blocks

    t0 = time.perf_counter()
    for i, r in enumerate(trace):
        eng.add_request(r.prompt_ids, params_for(r, i))
    steps = common.drain(eng, on_step)
    return {"saving": 1 - physical / logical if logical else 0.0,
            "seconds": time.perf_counter() - t0, "steps": steps}


def _parallel(n: int):
    return lambda r, i: SamplingParams(n=n, temperature=1.0, seed=i, max_tokens=r.output_len,
                                       ignore_eos=True)


def _beam(width: int):
    return lambda r, i: SamplingParams(beam_width=width, max_tokens=r.output_len, ignore_eos=True)


def beam_vs_independent(loaded, trace) -> dict:
    """Beam width 4 per prompt against four sampled requests per prompt (same engine config)."""
    useful = 4 * sum(r.output_len for r in trace)
    eng = common.engine(loaded)
    common.say("throughput: beam width 4")
    beam = measure_saving(eng, trace, _beam(4))
    common.say("throughput: four independent requests per prompt")
    four = [r for r in trace for _ in range(4)]
    indep = measure_saving(
        eng, four, lambda r, i: SamplingParams(temperature=1.0, seed=i, max_tokens=r.output_len,
                                               ignore_eos=True))
    return {
        "beam4_tok_s": useful / beam["seconds"],
        "independent4_tok_s": useful / indep["seconds"],
        "beam4_vs_independent": indep["seconds"] / beam["seconds"],
        "beam4_saving": beam["saving"],
        "independent4_saving": indep["saving"],
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser("sharing", "memory saved by parallel sampling and beam search",
                      DEFAULT_SCALE)
    p.add_argument("--requests", type=int, default=None,
                   help="requests per configuration (default: alpaca 8, sharegpt 4)")
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    args = common.parse(p, argv)

    loaded = common.load(args.model)
    vocab = loaded.config.vocab_size
    traces = {
        "alpaca": make_trace(ALPACA, args.requests or REQUESTS["alpaca"],
                             scale=min(1.0, 4 * args.scale), seed=args.seed, vocab_size=vocab),
        "sharegpt": make_trace(SHAREGPT, args.requests or REQUESTS["sharegpt"],
                               scale=args.scale, seed=args.seed, vocab_size=vocab),
    }
    eng = common.engine(loaded)
    eng.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    results = []
    for workload, trace in traces.items():
        for mode, make in (("parallel", _parallel), ("beam", _beam)):
            for width in WIDTHS:
                res = measure_saving(eng, trace, make(width))
                common.say(f"{workload} {mode} {width}: saving {res['saving']:.3f} "
                           f"({res['seconds']:.1f} s)")
                results.append({"workload": workload, "mode": mode, "width": width,
                                "saving": res["saving"], "seconds": res["seconds"]})
    del eng
    result = {
        "benchmark": "sharing",
        "scale": args.scale,
        "alpaca_length_scale": min(1.0, 4 * args.scale),
        "seed": args.seed,
        **common.model_info(loaded),
        "workloads": {name: describe(t) for name, t in traces.items()},
        "results": results,
        **beam_vs_independent(loaded, traces["sharegpt"]),
        "goals": {"beam6_alpaca": 0.55, "beam6_sharegpt": 0.66,
                  "parallel6_alpaca": 0.10, "parallel6_sharegpt": 0.30},
    }
    if args.plot:
        result["plot"] = plots.sharing(result, args.plot)
    return common.emit(common.round_floats(result))
