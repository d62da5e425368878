"""`chatpage bench single`: one chat at batch 1, in every weight format, against llama.cpp.

For each format (``engine/model/weights.py``): time to the first token of a ``--prompt-tokens`` prompt,
then the median decode step over ``--new-tokens`` greedy tokens (EOS ignored), the bytes of
weights one step reads, and that step against the weight-read floor (those bytes at the memory
read rate a plain reduction reaches with the run's threads) and against its matmuls alone.
llama.cpp (llama-cpp-python, when installed) decodes the same prompt ids from the same GGUF, with
the same threads and clock, in the same run: ``--repeats`` rounds in which each format's pass
follows a pass of llama.cpp, so each format's ratio is the median of ratios of passes a second
apart (a shared machine's speed drifts from one minute to the next); rates and times are each
side's best pass. The read rate is measured around each pass in the same way (just before and
just after it), and a format's floor ratio is the median of its passes' ratios.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Any

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_least, at_most, listed, reader, table
from chatpage.bench.throughput import _gguf, gemm_step_s, with_bandwidth
from chatpage.engine import SamplingParams
from chatpage.vocab import WEIGHT_FORMATS

PROMPT_TOKENS = 128
NEW_TOKENS = 128
GOAL_TOK_S = 80.0
GOAL_RATIO_VS_LLAMACPP = 1.0
GOAL_FP32_FLOOR_RATIO = 1.3


def prompt_ids(tokenizer, n: int) -> list[int]:
    """The first ``n`` tokens of the quality text (real text, fixed), as a text prompt gets them
    (the model's BOS first where its tokenizer puts one)."""
    from chatpage.bench.quality import TEXT

    ids = tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=True)
    return ids[:n]


def measure(eng, prompt: list[int], new_tokens: int) -> dict:
    """TTFT and median decode step of one greedy request alone on ``eng``."""
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True))
    times = []
    while eng.has_unfinished():
        t0 = common.now()
        eng.step()
        times.append(common.now() - t0)
    step = statistics.median(times[1:])
    return {"ttft_ms": times[0] * 1e3, "step_ms": step * 1e3, "decode_tok_s": 1 / step}


def run(args) -> dict:
    loaded = common.load(args.model)
    prompt = prompt_ids(loaded.tokenizer, args.prompt_tokens)
    threads = common.model_info(loaded)["threads"]
    peer, error = _llamacpp(args.model, prompt, args.new_tokens)
    if peer is not None:
        peer.run()  # warm-up, as for every format below
    engines = {}
    for fmt in args.weights:
        common.say(f"chatpage: {fmt}")
        engines[fmt] = common.engine(loaded, weight_dtype=fmt)
        measure(engines[fmt], prompt[:16], 8)  # warm-up: kernels, allocator, every path once
    passes: dict[str, list[dict]] = {fmt: [] for fmt in args.weights}
    theirs: dict[str, list[dict]] = {fmt: [] for fmt in args.weights}  # the pass just before
    try:
        for r in range(args.repeats):
            common.say(f"round {r + 1}/{args.repeats}")
            for fmt, eng in engines.items():
                if peer is not None:
                    theirs[fmt].append(peer.run())
                mine, bandwidth = with_bandwidth(
                    functools.partial(measure, eng, prompt, args.new_tokens)
                )
                passes[fmt].append({**mine, "bandwidth": bandwidth})
    finally:
        if peer is not None:
            peer.close()
    every_peer = [p for runs in theirs.values() for p in runs]
    best_peer = max(every_peer, key=lambda p: p["llamacpp_tok_s"]) if peer is not None else error
    rows = []
    for fmt, eng in engines.items():
        best = max(passes[fmt], key=lambda r: r["decode_tok_s"])
        weight_bytes = eng.model.weight_bytes
        bandwidth = statistics.median(p["bandwidth"] for p in passes[fmt])
        floor_ratios = [p["step_ms"] / (weight_bytes / p["bandwidth"] * 1e3) for p in passes[fmt]]
        row = {
            "weights": fmt,
            "threads": threads,
            "prompt_tokens": len(prompt),
            **{k: v for k, v in best.items() if k != "bandwidth"},
            "matmul_ms": gemm_step_s(eng.model, 1) * 1e3,
            "weight_bytes": weight_bytes,
            "read_bandwidth_gb_s": bandwidth / 1e9,
            "floor_ms": weight_bytes / bandwidth * 1e3,
            "round_floor_ratios": floor_ratios,
            "floor_ratio": statistics.median(floor_ratios),
            "llamacpp_tok_s": best_peer.get("llamacpp_tok_s"),
        }
        if peer is not None:
            ratios = [
                mine["decode_tok_s"] / other["llamacpp_tok_s"]
                for mine, other in zip(passes[fmt], theirs[fmt], strict=True)
            ]
            row["round_ratios_vs_llamacpp"] = ratios
        row["ratio_vs_llamacpp"] = statistics.median(ratios) if peer is not None else None
        rows.append(row)
    best_row = max(rows, key=lambda r: r["decode_tok_s"])
    fp32 = next((r for r in rows if r["weights"] == "fp32"), None)
    return {
        "benchmark": "single",
        **common.model_info(loaded),
        "prompt_tokens": len(prompt),
        "new_tokens": args.new_tokens,
        "rounds": args.repeats,
        "results": rows,
        **best_peer,
        **({"llamacpp_amx": peer.amx} if peer is not None else {}),
        "best_weights": best_row["weights"],
        "best_decode_tok_s": best_row["decode_tok_s"],
        "best_ratio_vs_llamacpp": best_row["ratio_vs_llamacpp"],
        "fp32_floor_ratio": fp32["floor_ratio"] if fp32 else None,
        "goals": {
            "decode_tok_s": GOAL_TOK_S,
            "ratio_vs_llamacpp": GOAL_RATIO_VS_LLAMACPP,
            "fp32_floor_ratio": GOAL_FP32_FLOOR_RATIO,
        },
    }


def _llamacpp(model: str | None, prompt: list[int], new_tokens: int):
    """(llama.cpp's batch-1 runner, None) for the run's GGUF, or (None, {"llamacpp_error": why})."""
    from chatpage.bench import llamacpp

    gguf = _gguf(model)
    if not llamacpp.available():
        return None, {"llamacpp_error": "llama_cpp is not importable (make bench-peers builds it)"}
    if gguf is None:
        return None, {
            "llamacpp_error": "llama.cpp needs a .gguf model (the default model or X.gguf)"
        }
    common.say("llama.cpp: batch 1")
    return llamacpp.LlamaCppSingle(gguf, prompt, new_tokens), None


def main(argv: list[str] | None = None) -> int:
    p = common.parser("single", __doc__.splitlines()[0], default_scale=1.0)
    p.add_argument(
        "--weights",
        type=common.weight_formats,
        default=list(WEIGHT_FORMATS),
        help="comma-separated weight formats (default: all)",
    )
    p.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    p.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="rounds of llama.cpp and every format (median ratio, fastest rates)",
    )
    args = common.parse(p, argv)
    if not 1 <= args.prompt_tokens <= 900 or args.new_tokens < 2 or args.repeats < 1:
        p.error("--prompt-tokens must be in [1, 900], --new-tokens >= 2 and --repeats >= 1")
    return common.emit(common.round_floats(run(args)), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormatFigures:
    """One weight format's batch-1 figures (the median round)."""

    weights: str
    decode_tok_s: float
    step_ms: float
    matmul_ms: float
    ttft_ms: float
    weight_bytes: int
    read_bandwidth_gb_s: float
    floor_ms: float
    floor_ratio: float
    ratio_vs_llamacpp: float | None
    round_floor_ratios: list[float] = field(default_factory=list)  # (older runs lack the rounds)
    round_ratios_vs_llamacpp: list[float] = field(default_factory=list)

    @property
    def matmul_gb_s(self) -> float:
        """The rate at which the matmuls alone read the weights."""
        return self.weight_bytes / self.matmul_ms / 1e6


@dataclass(frozen=True)
class SingleResult:
    """What the report reads of a run's JSON; the llama.cpp fields where it ran."""

    prompt_tokens: int
    new_tokens: int
    threads: int
    clock: str
    results: list[FormatFigures]
    best_weights: str
    rounds: int = 1
    vector_isa: str | None = None
    llamacpp_tok_s: float | None = None
    llamacpp_ttft_ms: float | None = None
    llamacpp_amx: bool | None = None
    llamacpp_error: str | None = None


def goals(s: SingleResult) -> list[Goal]:
    rows = {r.weights: r for r in s.results}
    best = rows[s.best_weights]
    ratio = best.ratio_vs_llamacpp
    out = [
        at_least(
            "single",
            f"decode tok/s at batch 1 ({s.best_weights})",
            best.decode_tok_s,
            GOAL_TOK_S,
            _why_speed(s, best),
        ),
        Goal(
            "single",
            f"{s.best_weights} / llama.cpp decode tok/s, same run",
            ratio,
            f">= {GOAL_RATIO_VS_LLAMACPP:.1f}",
            None if ratio is None else ratio >= GOAL_RATIO_VS_LLAMACPP,
            _why_llamacpp(s, best),
        ),
    ]
    if "fp32" in rows:
        f = rows["fp32"]
        out.append(
            at_most(
                "single",
                "fp32 batch-1 step / weight-read floor",
                f.floor_ratio,
                GOAL_FP32_FLOOR_RATIO,
                _why_fp32_floor(f),
            )
        )
    return out


def _why_speed(s: SingleResult, best: FormatFigures) -> str:
    other = best.step_ms - best.matmul_ms
    return (
        f"a {s.prompt_tokens}-token prompt, then {s.new_tokens} tokens on "
        f"{s.threads} thread(s): a step is {best.step_ms:.1f} ms, of which "
        f"{best.matmul_ms:.1f} ms are the matmuls ({best.weight_bytes / 1e6:.0f} MB "
        f"read at {best.matmul_gb_s:.1f} GB/s) and "
        f"{other:.1f} ms attention, the fused ops, sampling and the engine's bookkeeping"
    )


def _why_llamacpp(s: SingleResult, best: FormatFigures) -> str:
    if best.ratio_vs_llamacpp is None or s.llamacpp_tok_s is None:
        return s.llamacpp_error or "llama.cpp was not measured"
    return (
        f"the median of {s.rounds} rounds, each pairing a pass of the two back to "
        f"back ({listed(best.round_ratios_vs_llamacpp)}); "
        f"llama.cpp's best {s.llamacpp_tok_s:.1f} tok/s on the same GGUF (Q4_1 layers, "
        f"Q8_0 output; chatpage's int4 keeps the lm_head in int8 the same way), same prompt "
        f"ids, threads and clock; its whole step is {1e3 / s.llamacpp_tok_s:.1f} ms against "
        f"chatpage's {best.step_ms:.1f} ms, whose matmuls alone take "
        f"{best.matmul_ms:.1f} ms (chatpage's native matmuls read "
        f"{best.matmul_gb_s:.1f} GB/s against the "
        f"{best.read_bandwidth_gb_s:.1f} GB/s of a plain reduction)" + _llamacpp_build(s)
    )


def _llamacpp_build(s: SingleResult) -> str:
    """On an AMX machine, how the llama.cpp measured was built (a run records it)."""
    if s.vector_isa != "amx" or s.llamacpp_amx is None:
        return ""
    if s.llamacpp_amx:
        return "; llama.cpp with its AMX kernels"
    return (
        "; llama.cpp without its AMX kernels, which crash on these machines "
        "(scripts/llamacpp_cmake_args.sh)"
    )


def _why_fp32_floor(f: FormatFigures) -> str:
    return (
        f"the median of the passes' ratios ({listed(f.round_floor_ratios)}), "
        f"each against the read rate measured just before and after it; reading "
        f"{f.weight_bytes / 1e6:.0f} MB of fp32 weights at the median "
        f"{f.read_bandwidth_gb_s:.1f} GB/s takes {f.floor_ms:.1f} ms; the best step "
        f"took {f.step_ms:.1f} ms, its matmuls alone {f.matmul_ms:.1f} ms (the native "
        f"fp32 GEMV streams at {f.matmul_gb_s:.1f} GB/s); the lower "
        "formats are the way to a faster step, fp32 stays the exact reference"
    )


def figures(r: SingleResult) -> list[str]:
    rows: list[list[Any]] = [
        [
            x.weights,
            x.decode_tok_s,
            x.step_ms,
            x.matmul_ms,
            x.ttft_ms,
            x.weight_bytes / 1e6,
            x.floor_ratio,
            x.ratio_vs_llamacpp,
        ]
        for x in r.results
    ]
    if r.llamacpp_tok_s:
        tok_s = r.llamacpp_tok_s
        rows.append(
            ["llama.cpp (GGUF)", tok_s, 1e3 / tok_s, None, r.llamacpp_ttft_ms, None, None, 1.0]
        )
    header = ["weights", "decode tok/s", "step (ms)", "matmuls (ms)", "TTFT (ms)"]
    return [
        f"One request, {r.prompt_tokens}-token prompt, {r.new_tokens} greedy tokens, "
        f"{r.threads} thread(s), {r.clock} clock; median read rate "
        f"{r.results[0].read_bandwidth_gb_s:.1f} GB/s.",
        "",
        table([*header, "weights read (MB)", "step / floor", "vs llama.cpp (median)"], rows),
    ]


SECTION = Section(reader(SingleResult), goals, figures)


if __name__ == "__main__":
    raise SystemExit(main())
