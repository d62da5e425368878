"""docs/benchmarks.md: goals and tables of the single-chat benchmarks (single, quality, ui,
startup) and the weight-format rows of throughput (``chatpage/bench/report.py`` renders everything else)."""

from __future__ import annotations

from collections.abc import Callable

from chatpage.vocab import DEFAULT_WEIGHTS

Add = Callable[[str, str, object, str, "bool | None", str], None]
Table = Callable[[list[str], list[list]], str]


def goals(results: dict, add: Add) -> None:
    """Add the goals of single, quality, ui, startup and throughput's best weight format."""
    s = results.get("single")
    if s:
        rows = {r["weights"]: r for r in s["results"]}
        best = rows[s["best_weights"]]
        add(
            "single",
            f"decode tok/s at batch 1 ({s['best_weights']})",
            best["decode_tok_s"],
            ">= 80",
            best["decode_tok_s"] >= 80,
            _why_speed(s, best),
        )
        ratio = best["ratio_vs_llamacpp"]
        add(
            "single",
            f"{s['best_weights']} / llama.cpp decode tok/s, same run",
            ratio,
            ">= 1.0",
            None if ratio is None else ratio >= 1.0,
            _why_llamacpp(s, best),
        )
        if "fp32" in rows:
            f = rows["fp32"]
            add(
                "single",
                "fp32 batch-1 step / weight-read floor",
                f["floor_ratio"],
                "<= 1.3",
                f["floor_ratio"] <= 1.3,
                _why_fp32_floor(f),
            )
    q = results.get("quality")
    if q:
        for r in q["formats"]:
            if r["goal_perplexity_delta"] is not None:
                add(
                    "quality",
                    f"{r['weights']} perplexity vs fp32",
                    r["perplexity_delta"],
                    f"<= {r['goal_perplexity_delta']:.0%}",
                    r["met"],
                    f"perplexity {r['perplexity']:.2f} against {q['formats'][0]['perplexity']:.2f} "
                    f"on {q['text_tokens']} tokens; top-1 agreement with fp32's greedy text "
                    f"{r['greedy_agreement']:.3f} over {q['greedy_tokens']} tokens",
                )
    u = results.get("ui")
    if u and "tui_tok_s" in u:
        ratio = u["tui_vs_engine_alone"]
        add(
            "ui",
            "one chat: tok/s in the TUI / engine alone",
            ratio,
            ">= 0.9",
            ratio >= 0.9,
            f"{u['tui_tok_s']:.1f} tok/s streamed in the TUI (redrawing at most 10 times a second "
            f"per pane, no input) against {u['engine_alone_tok_s']:.1f} for the same request with "
            f"no UI, {u['threads']} engine thread(s); while keys are typed and timed: "
            f"{u['tui_typing_tok_s']:.1f} tok/s ({u['tui_typing_vs_engine_alone']:.2f})",
        )
        add(
            "ui",
            "cached start to model ready",
            u["model_ready_s"],
            "<= 3 s",
            u["model_ready_s"] <= 3,
            f"from process start (interpreter, imports, Textual's first "
            f"paint at {u['first_paint_s']:.2f} s) to the engine ready, {u['weights']} weights "
            "read from the packed cache",
        )
    st = results.get("startup")
    if st:
        for r in st["results"]:
            add(
                "startup",
                f"cached start to model ready, {r['weights']}",
                r["model_ready_s"],
                "<= 3 s",
                r["model_ready_s"] <= 3,
                f"the median of {st['rounds']} starts in fresh processes, the formats taking "
                f"turns ({_listed(r['starts_s'])} s; first paint "
                f"{r['first_paint_s']:.2f} s): the real app from process start to the engine ready",
            )
    t = results.get("throughput")
    if t and "best_ratio" in t:
        add(
            "throughput",
            f"chatpage ({t['best_weights']}) / transformers (fp32) useful tok/s",
            t["best_ratio"],
            ">= 8",
            t["best_ratio"] >= 8,
            "the best weight format on the same trace; "
            + ", ".join(f"{f['weights']} {f['tok_s']:.1f} tok/s" for f in t["formats"])
            + f" against transformers' {t['hf_tok_s']:.1f}",
        )
        default = next((f for f in t["formats"] if f["weights"] == DEFAULT_WEIGHTS), None)
        if default is not None:
            add(
                "throughput",
                f"chatpage ({DEFAULT_WEIGHTS}, the default) / transformers (fp32) useful tok/s",
                default["ratio"],
                ">= 12",
                default["ratio"] >= 12,
                f"the app's default weight format, {default['tok_s']:.1f} tok/s at a mean batch "
                f"of {default['mean_batch']:.1f} on the same trace, against transformers' "
                f"{t['hf_tok_s']:.1f}",
            )


def _why_speed(s: dict, best: dict) -> str:
    other = best["step_ms"] - best["matmul_ms"]
    return (
        f"a {s['prompt_tokens']}-token prompt, then {s['new_tokens']} tokens on "
        f"{s['threads']} thread(s): a step is {best['step_ms']:.1f} ms, of which "
        f"{best['matmul_ms']:.1f} ms are the matmuls ({best['weight_bytes'] / 1e6:.0f} MB "
        f"read at {_matmul_gb_s(best):.1f} GB/s) and "
        f"{other:.1f} ms attention, the fused ops, sampling and the engine's bookkeeping"
    )


def _why_llamacpp(s: dict, best: dict) -> str:
    if best["ratio_vs_llamacpp"] is None:
        return s.get("llamacpp_error", "llama.cpp was not measured")
    return (
        f"the median of {s.get('rounds', 1)} rounds, each pairing a pass of the two back to "
        f"back ({_listed(best.get('round_ratios_vs_llamacpp', []))}); "
        f"llama.cpp's best {s['llamacpp_tok_s']:.1f} tok/s on the same GGUF (Q4_1 layers, "
        f"Q8_0 output; chatpage's int4 keeps the lm_head in int8 the same way), same prompt "
        f"ids, threads and clock; its whole step is {1e3 / s['llamacpp_tok_s']:.1f} ms against "
        f"chatpage's {best['step_ms']:.1f} ms, whose matmuls alone take "
        f"{best['matmul_ms']:.1f} ms (chatpage's native matmuls read "
        f"{_matmul_gb_s(best):.1f} GB/s against the "
        f"{best['read_bandwidth_gb_s']:.1f} GB/s of a plain reduction)" + _llamacpp_build(s)
    )


def _llamacpp_build(s: dict) -> str:
    """On an AMX machine, how the llama.cpp measured was built (a run records it)."""
    if s.get("vector_isa") != "amx" or "llamacpp_amx" not in s:
        return ""
    if s["llamacpp_amx"]:
        return "; llama.cpp with its AMX kernels"
    return (
        "; llama.cpp without its AMX kernels, which crash on these machines "
        "(scripts/llamacpp_cmake_args.sh)"
    )


def _why_fp32_floor(f: dict) -> str:
    return (
        f"the median of the passes' ratios ({_listed(f.get('round_floor_ratios', []))}), "
        f"each against the read rate measured just before and after it; reading "
        f"{f['weight_bytes'] / 1e6:.0f} MB of fp32 weights at the median "
        f"{f['read_bandwidth_gb_s']:.1f} GB/s takes {f['floor_ms']:.1f} ms; the best step "
        f"took {f['step_ms']:.1f} ms, its matmuls alone {f['matmul_ms']:.1f} ms (the native "
        f"fp32 GEMV streams at {_matmul_gb_s(f):.1f} GB/s); the lower "
        "formats are the way to a faster step, fp32 stays the exact reference"
    )


def _listed(values: list[float]) -> str:
    """``1.21, 1.37, 1.33``: a run's per-round figures."""
    return ", ".join(f"{x:.2f}" for x in values)


def _matmul_gb_s(row: dict) -> float:
    """The rate at which a row's matmuls alone read its weights."""
    return row["weight_bytes"] / row["matmul_ms"] / 1e6


def figures(name: str, r: dict, table: Table) -> list[str]:
    """The tables of ``single``, ``quality``, ``ui`` and ``startup``; [] for any other."""
    if name == "single":
        rows = [
            [
                x["weights"],
                x["decode_tok_s"],
                x["step_ms"],
                x["matmul_ms"],
                x["ttft_ms"],
                x["weight_bytes"] / 1e6,
                x["floor_ratio"],
                x["ratio_vs_llamacpp"],
            ]
            for x in r["results"]
        ]
        if r.get("llamacpp_tok_s"):
            rows.append(
                [
                    "llama.cpp (GGUF)",
                    r["llamacpp_tok_s"],
                    1e3 / r["llamacpp_tok_s"],
                    None,
                    r["llamacpp_ttft_ms"],
                    None,
                    None,
                    1.0,
                ]
            )
        return [
            f"One request, {r['prompt_tokens']}-token prompt, {r['new_tokens']} greedy tokens, "
            f"{r['threads']} thread(s), {r['clock']} clock; median read rate "
            f"{r['results'][0]['read_bandwidth_gb_s']:.1f} GB/s.",
            "",
            table(
                [
                    "weights",
                    "decode tok/s",
                    "step (ms)",
                    "matmuls (ms)",
                    "TTFT (ms)",
                    "weights read (MB)",
                    "step / floor",
                    "vs llama.cpp (median)",
                ],
                rows,
            ),
        ]
    if name == "startup":
        rows = [
            [x["weights"], x["model_ready_s"], x["slowest_model_ready_s"], x["first_paint_s"]]
            for x in r["results"]
        ]
        return [
            f"A cached start of the TUI in each weight format, {r['rounds']} rounds of fresh "
            f"processes, {r['results'][0]['threads']} engine thread(s).",
            "",
            table(
                ["weights", "model ready, median (s)", "slowest (s)", "first paint, median (s)"],
                rows,
            ),
        ]
    if name == "ui":
        return [
            f"One chat in the TUI ({r['weights']} weights, {r['threads']} engine thread(s)): "
            f"{r['tui_tok_s']:.1f} tok/s streaming, {r['tui_typing_tok_s']:.1f} while typing, "
            f"{r['engine_alone_tok_s']:.1f} with no UI (**{r['tui_vs_engine_alone']:.2f}**, "
            f"{r['tui_typing_vs_engine_alone']:.2f} typing); keystroke to screen p50 "
            f"{r['keystroke_p50_ms']:.1f} ms, p99 {r['keystroke_p99_ms']:.1f} ms; first paint "
            f"{r['first_paint_s']:.2f} s, model ready {r['model_ready_s']:.2f} s."
        ]
    if name == "quality":
        rows = [
            [
                x["weights"],
                x["perplexity"],
                100 * x["perplexity_delta"],
                x["greedy_agreement"],
                x["greedy_prefix_tokens"],
                x["weight_bytes"] / 1e6,
            ]
            for x in r["formats"]
        ]
        return [
            f"Perplexity on `chatpage/bench/data/{r['text']}` ({r['text_tokens']} tokens); "
            f"agreement with fp32's {r['greedy_tokens']} greedy tokens.",
            "",
            table(
                [
                    "weights",
                    "perplexity",
                    "change (%)",
                    "top-1 agreement",
                    "identical prefix (tokens)",
                    "weights read (MB)",
                ],
                rows,
            ),
        ]
    return []
