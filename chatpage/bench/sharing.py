"""Memory saved by sharing KV blocks (the paper's Figure 15), and beam search's throughput.

For parallel sampling (n = 2, 4, 6; temperature 1) and beam search (width 2, 4, 6), a small trace
runs on the engine with EOS ignored; after every step the engine's own counters give

    saving = 1 - physical / logical,  physical = blocks_used - blocks_pinned,
                                       logical  = stats.logical_blocks (sum of block tables),

time-averaged as 1 - sum(physical) / sum(logical) over the steps.

Scaling: ShareGPT-shaped lengths are multiplied by ``--scale`` (default 0.25: mean input 40,
output 84); Alpaca-shaped lengths, already short, by min(1, 4 x scale) (full size by default).
Prompts are real text (windows of the shipped personas' prompts): how long beams keep sharing
depends on how they diverge, and on random-token prompts the model's next-token distribution is
so flat that beams split within a few tokens and never meet again, which is not what beam search
over text does. ``--random-prompts`` measures that case.

Throughput: beam width 4 against four independent requests of the same prompt (sampled with
different seeds), both producing four sequences per prompt, on the ShareGPT-shaped trace, each
on a fresh engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatpage.bench import common, plots
from chatpage.bench.reporting import Goal, Section, at_least, reader, table
from chatpage.bench.workloads import ALPACA, SHAREGPT, describe, make_trace, persona_text_tokens
from chatpage.engine import SamplingParams

DEFAULT_SCALE = 0.25
WIDTHS = (2, 4, 6)
REQUESTS = {"alpaca": 8, "sharegpt": 4}
# the memory saved at width 6 (beam search, n parallel samples) against separate requests
GOAL_SAVINGS = (
    ("alpaca", "beam", 0.55),
    ("sharegpt", "beam", 0.66),
    ("alpaca", "parallel", 0.10),
    ("sharegpt", "parallel", 0.30),
)


def measure_saving(eng, trace, params_for) -> dict:
    """Run ``trace`` with ``params_for(request, index)``; time-averaged saving and wall time."""
    physical = logical = 0

    def on_step(e, _outs) -> None:
        nonlocal physical, logical
        s = e.stats()
        physical += s.blocks_used - s.blocks_pinned
        logical += s.logical_blocks

    t0 = common.now()
    for i, r in enumerate(trace):
        eng.add_request(r.prompt_ids, params_for(r, i))
    steps = common.drain(eng, on_step)
    return {
        "saving": 1 - physical / logical if logical else 0.0,
        "seconds": common.now() - t0,
        "steps": steps,
    }


def _parallel(n: int):
    return lambda r, i: SamplingParams(
        n=n, temperature=1.0, seed=i, max_tokens=r.output_len, ignore_eos=True
    )


def _beam(width: int):
    return lambda r, i: SamplingParams(beam_width=width, max_tokens=r.output_len, ignore_eos=True)


def _warm(eng):
    eng.generate([list(range(100, 116))], SamplingParams(temperature=0, max_tokens=2))
    return eng


def beam_vs_independent(loaded, trace) -> dict:
    """Beam width 4 per prompt against four sampled requests per prompt (same engine config)."""
    useful = 4 * sum(r.output_len for r in trace)
    common.say("throughput: beam width 4")
    beam = measure_saving(_warm(common.engine(loaded)), trace, _beam(4))
    common.say("throughput: four independent requests per prompt")
    four = [r for r in trace for _ in range(4)]
    indep = measure_saving(_warm(common.engine(loaded)), four, _parallel(1))
    return {
        "beam4_tok_s": useful / beam["seconds"],
        "independent4_tok_s": useful / indep["seconds"],
        "beam4_vs_independent": indep["seconds"] / beam["seconds"],
        "beam4_saving": beam["saving"],
        "independent4_saving": indep["saving"],
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser("sharing", "memory saved by parallel sampling and beam search", DEFAULT_SCALE)
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per configuration (default: alpaca 8, sharegpt 4)",
    )
    p.add_argument(
        "--random-prompts",
        action="store_true",
        help="random token ids as prompts instead of real text",
    )
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    args = common.parse(p, argv)

    loaded = common.load(args.model)
    vocab = loaded.config.vocab_size
    text = None if args.random_prompts else persona_text_tokens(loaded.tokenizer)
    traces = {
        "alpaca": make_trace(
            ALPACA,
            args.requests or REQUESTS["alpaca"],
            scale=min(1.0, 4 * args.scale),
            seed=args.seed,
            vocab_size=vocab,
            text_tokens=text,
        ),
        "sharegpt": make_trace(
            SHAREGPT,
            args.requests or REQUESTS["sharegpt"],
            scale=args.scale,
            seed=args.seed,
            vocab_size=vocab,
            text_tokens=text,
        ),
    }
    eng = _warm(common.engine(loaded))
    results = []
    for workload, trace in traces.items():
        for mode, make in (("parallel", _parallel), ("beam", _beam)):
            for width in WIDTHS:
                res = measure_saving(eng, trace, make(width))
                common.say(
                    f"{workload} {mode} {width}: saving {res['saving']:.3f} "
                    f"({res['seconds']:.1f} s)"
                )
                results.append(
                    {
                        "workload": workload,
                        "mode": mode,
                        "width": width,
                        "saving": res["saving"],
                        "seconds": res["seconds"],
                    }
                )
    del eng
    result = {
        "benchmark": "sharing",
        "scale": args.scale,
        "alpaca_length_scale": min(1.0, 4 * args.scale),
        "prompts": "random" if args.random_prompts else "text",
        "seed": args.seed,
        **common.model_info(loaded),
        "workloads": {name: describe(t) for name, t in traces.items()},
        "results": results,
        **beam_vs_independent(loaded, traces["sharegpt"]),
        "goals": {f"{mode}6_{workload}": goal for workload, mode, goal in GOAL_SAVINGS},
    }
    if args.plot:
        result["plot"] = plots.sharing(result, args.plot)
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    mean_input: float
    mean_output: float


@dataclass(frozen=True)
class Saving:
    workload: str
    mode: str
    width: int
    saving: float


@dataclass(frozen=True)
class SharingResult:
    """What the report reads of a run's JSON."""

    scale: float
    alpaca_length_scale: float
    workloads: dict[str, Shape]
    results: list[Saving]
    beam4_tok_s: float
    independent4_tok_s: float
    beam4_vs_independent: float


def goals(h: SharingResult) -> list[Goal]:
    def saving(workload: str, mode: str, width: int) -> float:
        return next(
            r.saving for r in h.results if (r.workload, r.mode, r.width) == (workload, mode, width)
        )

    return [
        at_least(
            "sharing",
            f"{'beam width 6' if mode == 'beam' else 'n = 6'} saving, {workload}-shaped",
            saving(workload, mode, 6),
            goal,
            _why(h, workload, mode),
            spec=".2f",
        )
        for workload, mode, goal in GOAL_SAVINGS
    ]


def _why(h: SharingResult, workload: str, mode: str) -> str:
    w = h.workloads[workload]
    if mode == "beam":
        return (
            "beams fork from each other and share every block up to the point they diverge; "
            "only the last, partly written block is copied on write"
        )
    return (
        f"the n samples share only the prompt's blocks (mean prompt {w.mean_input:.0f} "
        f"tokens vs mean output {w.mean_output:.0f}); every sample's output is its own"
    )


def figures(r: SharingResult) -> list[str]:
    rows = [[x.workload, x.mode, x.width, 100 * x.saving] for x in r.results]
    return [
        f"ShareGPT lengths x {r.scale}, Alpaca lengths x {r.alpaca_length_scale}.",
        "",
        table(["workload", "mode", "width", "memory saving (%)"], rows),
        "",
        f"Beam width 4: {r.beam4_tok_s:.1f} tok/s against four independent requests: "
        f"{r.independent4_tok_s:.1f} tok/s (**{r.beam4_vs_independent:.2f}x**).",
    ]


SECTION = Section(reader(SharingResult), goals, figures, plotted=True)
