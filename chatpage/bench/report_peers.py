"""docs/benchmarks.md: goals and tables of ``chatpage bench peers`` (``chatpage serve`` against
vLLM's CPU backend, both driven by vLLM's own client; ``chatpage/bench/peers.py``). The benchmark
takes ~6 min a round on 2 cores (the report runs 3) and installs vLLM into an ignored folder, so
``make bench`` leaves it out and ``make bench-peers`` runs it
(``python -m chatpage.bench.report docs/benchmarks.md --only peers``)."""

from __future__ import annotations

from chatpage.bench.report_single import Add, Table

# the runs of vLLM's client first (by concurrency), then the chat-shaped runs of peers.py
SHAPED = {"chats": "8 chats, one shared system prompt", "samples": "8 requests of n = 4"}


def _label(run: str) -> str:
    return SHAPED.get(run, f"concurrency {run}")


def _ordered(r: dict) -> list[str]:
    runs = list(r["runs"])
    return sorted((x for x in runs if x.isdigit()), key=int) + [x for x in runs if x in SHAPED]


def goals(results: dict, add: Add) -> None:
    """Per run: the throughput ratio against vLLM, and TTFT/TPOT p50 not above vLLM's."""
    p = results.get("peers")
    if not p:
        return
    for run in _ordered(p):
        x = p["runs"][run]
        ours, theirs = x["chatpage"], x["vllm"]
        rounds = ", ".join(f"{v:.2f}" for v in x["ratios"])
        add(
            "peers",
            f"chatpage / vLLM output tok/s, {_label(run)}",
            x["ratio"],
            f">= {x['goal_ratio']}",
            x["ratio_ok"],
            f"{ours['output_tok_s']:.1f} against {theirs['output_tok_s']:.1f} tok/s "
            f"({p['rounds']} round(s): {rounds}); completed {ours['completed']} and "
            f"{theirs['completed']}",
        )
        add(
            "peers",
            f"TTFT p50 and TPOT p50 <= vLLM's, {_label(run)}",
            f"{ours['ttft_p50_ms']:.0f} / {ours['tpot_p50_ms']:.1f} ms",
            f"<= {theirs['ttft_p50_ms']:.0f} / {theirs['tpot_p50_ms']:.1f} ms",
            x["ttft_ok"] and x["tpot_ok"],
            "chatpage's against vLLM's, the same run",
        )


def figures(r: dict, table: Table) -> list[str]:
    """The side-by-side table of every run."""
    rows = []
    for run in _ordered(r):
        x = r["runs"][run]
        for name in ("chatpage", "vllm"):
            s = x[name]
            rows.append(
                [
                    _label(run),
                    name,
                    s["output_tok_s"],
                    s["ttft_p50_ms"],
                    s["ttft_p99_ms"],
                    s["tpot_p50_ms"],
                    s["tpot_p99_ms"],
                    s["completed"],
                    x["ratio"] if name == "chatpage" else "",
                ]
            )
    return [
        f"`chatpage serve` (its default format, no flags) against {r['peer']} serving "
        f"{r['model']} in bf16, one server alive at a time, {r['cores']} cores, wall clock, "
        f"each with its default threads. Random prompts of {r['input_len']} tokens and "
        f"{r['output_len']} output tokens (EOS ignored), driven by vLLM's own client "
        "(`vllm.benchmarks.serve`); the chat-shaped runs by chatpage's driver (streamed "
        "`/v1/chat/completions`, prefix caching on for both).",
        "",
        *_avx2_caveat(r),
        table(
            [
                "run",
                "server",
                "output tok/s",
                "TTFT p50 (ms)",
                "TTFT p99 (ms)",
                "TPOT p50 (ms)",
                "TPOT p99 (ms)",
                "completed",
                "ratio",
            ],
            rows,
        ),
    ]


def _avx2_caveat(r: dict) -> list[str]:
    """On an AVX2-only machine, the line that says vLLM's CPU backend is not at its best there."""
    if r.get("vector_isa") != "avx2":
        return []
    return [
        "This run is an AVX2-only machine's: vLLM's CPU kernels are built for AVX-512, and on "
        "the AVX-512 machines of this kind it measured 27.8 / 177.7 / 255.0 output tok/s at "
        "concurrency 1 / 8 / 32 (issue 19), 4-12x this run's vLLM figures; the ratios here say "
        "nothing about those machines.",
        "",
    ]
