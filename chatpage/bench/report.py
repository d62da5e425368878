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

With ``--only`` and no ``--results``, the other benchmarks' results are read back from the report
being rewritten (its JSON blocks), so one benchmark can be rerun without the others. A full run
runs every benchmark but ``peers`` (``make bench-peers``) and keeps that one's last figures.
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

from chatpage.bench import report_files, report_peers, report_single

# One torch thread and the CPU-time clock (bench/common.now): on a shared 2-core machine, two
# OpenMP threads collapse whenever another process runs, and wall times swing by 2-10x.
DEFAULT_BENCH_ARGS = "--threads 1"
ORDER = (
    "single",
    "quality",
    "ui",
    "startup",
    "throughput",
    "memory",
    "windows",
    "serve",
    "serve_api",
    "prefix",
    "sharing",
    "structured",
    "soak",
    "kernel",
    "load",
    "peers",
)
# Run only when named (``make bench-peers``: 3 rounds of ~6 min on 2 cores once vLLM is installed
# into .peers/, which the first run does);
# a full ``make bench`` keeps the figures of its last run.
NAMED_ONLY = ("peers",)
# Arguments of one benchmark only (the TUI bench: one chat, long enough to outlast the keys).
BENCH_ARGS = {
    "ui": ["--sessions", "1", "--max-tokens", "1500"],
    # against llama.cpp on the default model's re-quantizations too, and load each of them and
    # the 0.5B-shaped file (bench/requant.py; where llama-cpp-python is missing both say so)
    "quality": ["--files", "requant"],
    "load": ["--files", "requant,qwen05,gemma270"],
    # the 64 streams, all decoding together from start to end (bench/serve_api.py)
    "serve_api": ["--concurrency", "64", "--output-tokens", "32"],
    # the median ratio of 3 whole comparisons: two rounds' vLLM figures differ by up to ~15% here
    "peers": ["--rounds", "3"],
}
# Benchmarks that are a mode of another command: their command line's words after "bench"
COMMANDS = {"serve_api": ["serve", "--api"]}
# The benchmarks that take none of --bench-args (kernel times its own threads; windows runs no
# model; peers runs both servers as a user runs them: default threads, wall clock)
OWN_ARGS = ("kernel", "windows", "peers")
PLOTTED = ("throughput", "memory", "serve", "prefix", "sharing")


def command(name: str, plot_dir: Path, extra: list[str]) -> list[str]:
    """The command line that runs benchmark ``name``."""
    cmd = [sys.executable, "-m", "chatpage.cli", "bench", *COMMANDS.get(name, [name]), "--json"]
    if name in PLOTTED:
        cmd += ["--plot", str(plot_dir / f"bench-{name}.png")]
    return cmd + BENCH_ARGS.get(name, []) + extra


def run_one(name: str, plot_dir: Path, extra: list[str]) -> dict:
    cmd = command(name, plot_dir, extra)
    print(f"== {shlex.join(cmd[2:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    seconds = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    entry = {
        "command": "chatpage " + shlex.join(cmd[3:]),
        "seconds": round(seconds, 1),
        "returncode": proc.returncode,
    }
    try:
        entry["result"] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        entry["error"] = f"no JSON on the last stdout line (exit status {proc.returncode})"
    return entry


# -- goals -------------------------------------------------------------------------------------
def _fmt(x) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"
    return str(x)


def goals(results: dict) -> list[dict]:
    """Every goal with its figure, target and whether it was met."""
    rows: list[dict] = []

    def add(bench: str, name: str, value, target: str, met: bool | None, why: str) -> None:
        rows.append(
            {"bench": bench, "goal": name, "value": value, "target": target, "met": met, "why": why}
        )

    report_single.goals(results, add)

    t = results.get("throughput")
    if t:
        add(
            "throughput",
            "chatpage / transformers useful tok/s",
            t["ratio"],
            ">= 8",
            t["ratio"] >= 8,
            _why_ratio(t),
        )
        if "fraction_of_gemm_bound" in t:
            f = t["fraction_of_gemm_bound"]
            add(
                "throughput",
                f"decode rate at {t['roofline_batch']} sequences / GEMM bound",
                f,
                ">= 0.75",
                f >= 0.75,
                _why_gemm(t),
            )
            r = t["batch1_floor_ratio"]
            add(
                "throughput",
                "batch-1 step / weight-read floor",
                r,
                "<= 1.3",
                r <= 1.3,
                _why_floor(t),
            )
    m = results.get("memory")
    if m:
        u = m["chatpage_utilization"]
        add("memory", "chatpage KV utilization", u, ">= 0.97", u >= 0.97, _why_memory(m))
    s = results.get("serve")
    if s:
        r = s["rate_ratio"]
        add(
            "serve",
            "sustainable rate chatpage / Oracle",
            r,
            ">= 2",
            r is not None and r >= 2 and s["sustainable_rate_oracle_how"] != "at least",
            _why_serve(s),
        )
    a = results.get("serve_api")
    if a:
        v = a["api_overhead_ms"]
        add(
            "serve_api",
            f"serve overhead per streamed token at {a['concurrency']} streams, ms",
            v,
            f"<= {a['goal_api_overhead_ms']:g}",
            v <= a["goal_api_overhead_ms"],
            _why_serve_api(a),
        )
    p = results.get("prefix")
    if p:
        add(
            "prefix",
            "TTFT cached / cold",
            p["ttft_ratio"],
            "<= 0.25",
            p["ttft_ratio"] <= 0.25,
            f"the pinned persona leaves {p['mean_prompt_tokens'] - p['cached_prefix_hit_tokens']:.0f}"
            f" of {p['mean_prompt_tokens']:.0f} prompt tokens to compute; the rest of TTFT is one "
            "step's fixed cost (30 layers of weights read, the lm_head, sampling)",
        )
        worst = max(r["computed_tokens"] - r["new_tokens"] for r in p["turns"])
        add(
            "prefix",
            "each turn computes <= new tokens + one block",
            f"worst excess {worst}",
            f"<= {p['block_size']}",
            p["all_turns_within_new_plus_block"],
            "only full blocks are shared by hash: a turn recomputes at most the partial block "
            "where the previous prompt + reply ended",
        )
    h = results.get("sharing")
    if h:

        def saving(workload, mode, width):
            return next(
                r["saving"]
                for r in h["results"]
                if (r["workload"], r["mode"], r["width"]) == (workload, mode, width)
            )

        for workload, mode, target in (
            ("alpaca", "beam", 0.55),
            ("sharegpt", "beam", 0.66),
            ("alpaca", "parallel", 0.10),
            ("sharegpt", "parallel", 0.30),
        ):
            v = saving(workload, mode, 6)
            label = "beam width 6" if mode == "beam" else "n = 6"
            add(
                "sharing",
                f"{label} saving, {workload}-shaped",
                v,
                f">= {target:.2f}",
                v >= target,
                _why_sharing(h, workload, mode),
            )
    g = results.get("structured")
    if g:
        for row in g["results"]:
            add(
                "structured",
                f"JSON-schema / free decode tok/s, {row['rows']} row(s)",
                row["ratio"],
                ">= 0.9",
                row["ratio"] >= 0.9,
                f"{row['json_schema_tok_s']:.1f} against {row['free_tok_s']:.1f} tok/s; the masks "
                f"take {row['mask_ms_per_step']:.2f} ms a step ({g['grammar_engine']})",
            )
        wide = max(g["results"], key=lambda r: r["rows"])
        add(
            "structured",
            f"mask time / decode step, {wide['rows']} rows",
            wide["mask_share"],
            "<= 0.1",
            wide["mask_share"] <= 0.1,
            "the rows' masks are computed together, in parallel, into one bitmask, then applied "
            "to the logits in one masked fill",
        )
    k = results.get("soak")
    if k:
        why = (
            f"{k['requests']} requests under preemption (swap, recompute, auto), "
            f"{k['aborted']} cancelled midway, {k['rejected']} refused, {k['extreme']} with "
            "extreme sampling values; the others must not notice"
        )
        for key, what in (
            ("failed_by_others", "requests failed by another request's values"),
            ("hung", "requests that never ended"),
            ("leaked_blocks", "KV blocks left allocated after the soak"),
            ("greedy_mismatches", "greedy outputs unlike the same request run alone"),
        ):
            add("soak", what, k[key], "0", k[key] == 0, why)
            why = "the same run"
    report_files.goals(results, add)
    report_peers.goals(results, add)
    return rows


def _why_ratio(t: dict) -> str:
    text = (
        f"chatpage ran a mean batch of {t['chatpage_mean_batch']:.1f} with no padding and no "
        f"waiting for a batch's longest request; transformers' best static batch "
        f"({t['hf_batch']}) decodes every request of a batch until its longest ends "
        f"(longest {t['longest']} tokens, mean output {t['mean_output']:.0f})"
    )
    if t["ratio"] >= 8 or "gemm_bound_tok_s" not in t:
        return text
    need = 8 * t["hf_tok_s"]
    return (
        text + f". 8x would need {need:.0f} tok/s: "
        f"{need / t['gemm_bound_tok_s']:.0%} of the matmul-only rate at batch "
        f"{t['roofline_batch']} ({t['gemm_bound_tok_s']:.0f} tok/s), for a trace whose mean "
        f"batch is {t['chatpage_mean_batch']:.0f} and whose last requests decode nearly alone; "
        f"chatpage's own steps run at {t['fraction_of_gemm_bound']:.0%} of that bound. "
        f"transformers is the faster side of the reference here: {t['hf_tok_s']:.1f} tok/s "
        "against the 20.5 measured on the machine the goal was set on"
    )


def _why_gemm(t: dict) -> str:
    gemm_ms = t["roofline_batch"] / t["gemm_bound_tok_s"] * 1e3
    other = t["decode_batch_step_ms"] - gemm_ms
    return (
        f"a decode step of {t['roofline_batch']} sequences took "
        f"{t['decode_batch_step_ms']:.0f} ms, the matmuls alone {gemm_ms:.0f} ms; the other "
        f"{other:.0f} ms are paged attention over ~{t['roofline_context']}-token contexts, "
        "norms, RoPE, the sampler and Python"
    )


def _why_floor(t: dict) -> str:
    text = (
        f"reading {t['weight_bytes'] / 1e6:.0f} MB of fp32 weights at "
        f"{t['read_bandwidth_gb_s']:.1f} GB/s (a plain reduction on {t['threads']} thread(s), "
        f"as the run, measured just before and after the step) takes "
        f"{t['weight_read_floor_ms']:.1f} ms; the step took "
        f"{t['batch1_step_ms']:.1f} ms"
    )
    if "batch1_gemm_ms" in t:
        rest = t["batch1_step_ms"] - t["batch1_gemm_ms"]
        text += (
            f": its matmuls alone {t['batch1_gemm_ms']:.1f} ms (they stream the weights at "
            f"{t['batch1_gemm_read_gb_s']:.1f} GB/s, the native fp32 GEMV), the other "
            f"{rest:.1f} ms are attention, the fused norm/RoPE/SwiGLU ops, sampling and the "
            "engine's Python"
        )
        if t["batch1_floor_ratio"] > 1.3:
            text += (
                "; the gap is the matmuls' shortfall from the floor's read rate plus the "
                "other work (the lower weight formats are the faster step)"
            )
    return text


def _why_memory(m: dict) -> str:
    live = m["mean_input"] + m["mean_output"] / 2
    return (
        f"paged blocks waste only the unfilled tail of each sequence's last block "
        f"(block size {m['block_size']}, about {m['block_size'] / 2:.0f} slots per sequence "
        f"against ~{live:.0f} live tokens); reservations hold slots for tokens not yet "
        f"generated (Oracle), rounding (Pow2) or the maximum length (Max)"
    )


def _why_serve(s: dict) -> str:
    top = max(x["rate"] for x in s["rates"])
    at = {r["system"]: r for r in s["rates"] if r["rate"] == top}
    c, o = at["chatpage"], at["oracle"]
    text = (
        f"with {s['kv_blocks']} KV blocks chatpage batches more at the highest rate "
        f"({c['mean_batch']:.1f} vs {o['mean_batch']:.1f}) and starts requests sooner "
        f"(TTFT p50 {c['ttft_p50_s']:.2f} vs {o['ttft_p50_s']:.2f} s), but on this CPU a "
        f"step's time grows with every sequence in it (matmuls are compute-bound from ~4 "
        f"rows), so TPOT rises with the batch ({c['tpot_p50_s'] * 1e3:.0f} vs "
        f"{o['tpot_p50_s'] * 1e3:.0f} ms) and recompute preemptions "
        f"({c['preemptions']}) cost steps; saturated capacities differ by "
        f"{s['capacity_ratio']:.2f}x. On a GPU a decode step costs about the same for 2 or "
        "20 sequences, which is what turns the paper's larger batches into 2-4x the rate"
    )
    if "at least" in (s["sustainable_rate_oracle_how"], s["sustainable_rate_chatpage_how"]):
        text += (
            "; a system stayed under the bound at every swept rate, so its rate is a lower bound"
        )
    return text


def _why_serve_api(a: dict) -> str:
    local, api = a["in_process"], a["api"]
    return (
        f"{api['streamed_tokens']} tokens streamed at once to {a['concurrency']} httpx clients "
        f"of the real server ({a['mean_output']:.0f} each), against the same requests read "
        f"in-process from the same engine, by {a['clock']} time of everything but the engine's "
        f"steps and the reader: the server's loop thread spent {a['server_thread_ms']:.3f} ms a "
        f"token, the client {a['client_ms']:.3f} (not counted); the steps, left out, took "
        f"{local['engine_thread_cpu_s']:.1f} s of CPU in-process and "
        f"{api['engine_thread_cpu_s']:.1f} s over HTTP (two runs' steps drift by ~10% on this "
        "shared machine, more than the goal)"
        f"; wall clock, the makespan grew by {a['wall_added_ms']:.2f} ms a token (TPOT p50 "
        f"{api['tpot_p50'] * 1e3:.0f} against {local['tpot_p50'] * 1e3:.0f} ms) and a token "
        f"reached its client {api['api_latency_p50_ms']:.1f} ms after the engine emitted it "
        f"(p99 {api['api_latency_p99_ms']:.1f})"
    )


def _why_sharing(h: dict, workload: str, mode: str) -> str:
    w = h["workloads"][workload]
    if mode == "beam":
        return (
            "beams fork from each other and share every block up to the point they diverge; "
            "only the last, partly written block is copied on write"
        )
    return (
        f"the n samples share only the prompt's blocks (mean prompt {w['mean_input']:.0f} "
        f"tokens vs mean output {w['mean_output']:.0f}); every sample's output is its own"
    )


# -- rendering ---------------------------------------------------------------------------------
def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_fmt(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def _section(name: str, entry: dict, report_dir: Path) -> list[str]:
    lines = [f"## {name}", "", f"`{entry['command']}` ({entry['seconds']:.0f} s)", ""]
    if "error" in entry:
        return lines + [f"**Failed:** {entry['error']}", ""]
    r = entry["result"]
    if r.get("vector_isa"):  # the CPU's vector paths the run took (a report can mix machines)
        lines += [f"Kernels: {r['vector_isa']}.", ""]
    lines += _figures(name, r) + [""]
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


def _figures(name: str, r: dict) -> list[str]:
    if name == "quality":
        files = report_files.figures(name, r, _table)
        return report_single.figures(name, r, _table) + ([""] + files if files else [])
    if name in ("single", "ui", "startup"):
        return report_single.figures(name, r, _table)
    if name in ("load", "windows"):
        return report_files.figures(name, r, _table)
    if name == "peers":
        return report_peers.figures(r, _table)
    if name == "throughput":
        rows = [
            ["chatpage", r["chatpage_tok_s"], r["chatpage_mean_batch"]],
            [f"transformers generate, batch {r['hf_batch']}", r["hf_tok_s"], r["hf_batch"]],
        ]
        for c in r["hf_candidates"]:
            if c["batch"] != r["hf_batch"]:
                state = (
                    f"{c['tok_s']:.1f}"
                    if c.get("tok_s")
                    else f"abandoned after {c['abandoned_after_s']:.0f} s (slower)"
                )
                rows.append([f"transformers, batch {c['batch']}", state, c["batch"]])
        rows[1:1] = [
            [f"chatpage, {f['weights']} weights", f["tok_s"], f["mean_batch"]]
            for f in r.get("formats", [])
            if f["weights"] != "fp32"
        ]
        if "llamacpp_batched_tok_s" in r:
            rows.append(["llama.cpp serial", r["llamacpp_serial_tok_s"], 1])
            rows.append(["llama.cpp batched", r["llamacpp_batched_tok_s"], r["requests"]])
        out = [
            f"{r['requests']} ShareGPT-shaped requests at scale {r['scale']} (mean input "
            f"{r['mean_input']}, mean output {r['mean_output']}, longest {r['longest']}), "
            f"{r['threads']} thread{'s' if r['threads'] != 1 else ''}, fp32, EOS ignored.",
            "",
            _table(["system", "useful output tok/s", "batch"], rows),
            "",
            f"Ratio: **{r['ratio']:.2f}x**"
            + (
                f" in fp32, **{r['best_ratio']:.2f}x** in {r['best_weights']}."
                if "best_ratio" in r
                else "."
            ),
        ]
        if "gemm_bound_tok_s" in r:
            out += [
                "",
                _table(
                    ["roofline", "value"],
                    [
                        [
                            f"GEMM bound at batch {r['roofline_batch']} (tok/s)",
                            r["gemm_bound_tok_s"],
                        ],
                        [
                            f"chatpage decode, {r['roofline_batch']} sequences (tok/s)",
                            r["decode_batch_tok_s"],
                        ],
                        ["fraction of GEMM bound", r["fraction_of_gemm_bound"]],
                        ["batch-1 step (ms)", r["batch1_step_ms"]],
                        [
                            f"read bandwidth, {r['threads']} thread(s) (GB/s)",
                            r["read_bandwidth_gb_s"],
                        ],
                        ["weight-read floor (ms)", r["weight_read_floor_ms"]],
                        ["batch-1 / floor", r["batch1_floor_ratio"]],
                    ]
                    + (
                        [
                            ["batch-1 matmuls alone (ms)", r["batch1_gemm_ms"]],
                            ["their weight read rate (GB/s)", r["batch1_gemm_read_gb_s"]],
                        ]
                        if "batch1_gemm_ms" in r
                        else []
                    ),
                ),
            ]
        return out
    if name == "memory":
        rows = [
            [label, 100 * r[f"{k}_utilization"], r[f"{k}_mean_batch"], r[f"{k}_max_batch"]]
            for label, k in (
                ("Max", "max"),
                ("Pow2", "pow2"),
                ("Oracle", "oracle"),
                ("chatpage", "chatpage"),
            )
        ]
        return [
            f"{r['requests']} ShareGPT-shaped requests at scale {r['scale']} (mean input "
            f"{r['mean_input']}, output {r['mean_output']}), KV budget "
            f"{r['kv_budget_tokens']} tokens, Max reserves {r['max_policy_len']}.",
            "",
            _table(
                ["policy", "KV memory holding token states (%)", "mean batch", "max batch"], rows
            ),
        ]
    if name == "serve":
        rows = [
            [
                x["rate"],
                x["system"],
                x["normalized_latency_s"],
                x["ttft_p50_s"],
                x["ttft_p99_s"],
                x["tpot_p50_s"],
                x["tpot_p99_s"],
                x["mean_batch"],
            ]
            for x in r["rates"]
        ]
        return [
            f"{r['requests']} {r['workload']}-shaped requests per rate at scale {r['scale']}, "
            f"{r['kv_blocks']} KV blocks, latency bound {r['latency_bound_s']:.3f} s/token.",
            "",
            _table(
                [
                    "rate (req/s)",
                    "system",
                    "normalized latency (s/tok)",
                    "TTFT p50",
                    "TTFT p99",
                    "TPOT p50",
                    "TPOT p99",
                    "mean batch",
                ],
                rows,
            ),
            "",
            f"Saturated capacity (whole trace at once): chatpage "
            f"{r['capacity_chatpage_req_s']:.3f} req/s, Oracle {r['capacity_oracle_req_s']:.3f} "
            f"req/s. Sustainable rate: chatpage {r['sustainable_rate_chatpage']:.3f} "
            f"({r['sustainable_rate_chatpage_how']}), Oracle "
            f"{r['sustainable_rate_oracle']:.3f} ({r['sustainable_rate_oracle_how']}); "
            f"ratio **{_fmt(r['rate_ratio'])}x**.",
        ]
    if name == "serve_api":
        rows = [
            [label, x["rate"], x["ttft_p50"], x["ttft_p99"], 1e3 * x["tpot_p50"], x["wall_s"]]
            for label, x in (("in-process", r["in_process"]), ("HTTP", r["api"]))
        ]
        return [
            f"{r['concurrency']} {r['workload']}-shaped requests at once (mean input "
            f"{r['mean_input']}, {r['mean_output']} output tokens each), streamed through "
            "`chatpage serve` to httpx clients, and read in-process from the same engine.",
            "",
            _table(
                [
                    "run",
                    "rate (req/s)",
                    "TTFT p50 (s)",
                    "TTFT p99 (s)",
                    "TPOT p50 (ms)",
                    "wall (s)",
                ],
                rows,
            ),
            "",
            f"Per streamed token: serving adds **{r['api_overhead_ms']:.3f} ms** "
            f"({r['clock']} clock), the server's loop thread {r['server_thread_ms']:.3f} ms, "
            f"the client {r['client_ms']:.3f} ms; emitted to received p50 "
            f"{r['api']['api_latency_p50_ms']:.1f} ms, p99 {r['api']['api_latency_p99_ms']:.1f} ms.",
        ]
    if name == "prefix":
        rows = [
            [
                t["turn"],
                t["prompt_tokens"],
                t["new_tokens"],
                t["computed_tokens"],
                t["prefix_hit_tokens"],
            ]
            for t in r["turns"]
        ]
        return [
            f"(a) {r['sessions']} sessions with the {r['persona']} persona "
            f"({r['persona_prefix_tokens']}-token prefix): TTFT cold "
            f"{r['cold_ttft_s'] * 1e3:.0f} ms, cached {r['cached_ttft_s'] * 1e3:.0f} ms, ratio "
            f"**{r['ttft_ratio']:.3f}**.",
            "",
            "(b) One conversation:",
            "",
            _table(["turn", "prompt tokens", "new tokens", "computed", "prefix hit"], rows),
        ]
    if name == "sharing":
        rows = [[x["workload"], x["mode"], x["width"], 100 * x["saving"]] for x in r["results"]]
        return [
            f"ShareGPT lengths x {r['scale']}, Alpaca lengths x {r['alpaca_length_scale']}.",
            "",
            _table(["workload", "mode", "width", "memory saving (%)"], rows),
            "",
            f"Beam width 4: {r['beam4_tok_s']:.1f} tok/s against four independent requests: "
            f"{r['independent4_tok_s']:.1f} tok/s (**{r['beam4_vs_independent']:.2f}x**).",
        ]
    if name == "structured":
        rows = [
            [x["rows"], x["free_tok_s"], x["json_schema_tok_s"], x["ratio"], 100 * x["mask_share"]]
            for x in r["results"]
        ]
        return [
            f"{r['tokens']} tokens per row, {r['weights']} weights, grammars by "
            f"{r['grammar_engine']}.",
            "",
            _table(["rows", "free tok/s", "JSON schema tok/s", "ratio", "masks (% of step)"], rows),
        ]
    if name == "soak":
        k = r["preemptions"]
        rows = [[mode, k[mode]["swap"], k[mode]["recompute"]] for mode in k]
        return [
            f"{r['requests']} requests in {r['steps']} engine steps ({r['seconds']:.1f} s): "
            f"{r['finished']} finished, {r['aborted']} cancelled, {r['rejected']} refused, "
            f"{r['errored']} errored ({r['extreme']} had extreme sampling values), "
            f"{r['hung']} hung, {r['leaked_blocks']} blocks leaked; "
            f"{r['greedy_mismatches']} of {r['greedy_checked']} greedy outputs differed.",
            "",
            _table(["preemption mode", "swap preemptions", "recompute preemptions"], rows),
        ]
    if name == "kernel":
        rows = [
            [
                c["kind"],
                c["batch"],
                c["context"],
                c["paged_ms"],
                c["contiguous_sdpa_ms"],
                c["gather_sdpa_ms"],
            ]
            for c in r["cases"]
        ]
        return [
            f"Kernels: {r['kernels']}.",
            "",
            _table(
                [
                    "kind",
                    "batch",
                    "context",
                    "paged (ms)",
                    "contiguous SDPA (ms)",
                    "gather + SDPA (ms)",
                ],
                rows,
            ),
        ]
    return []


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
    rows = [
        [
            g["bench"],
            g["goal"],
            g["value"],
            g["target"],
            "met" if g["met"] else "**missed**",
            g["why"],
        ]
        for g in goals(results)
    ]
    lines += [_table(["bench", "goal", "figure", "target", "status", "why"], rows), ""]
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
    if args.results:
        saved = json.loads(args.results.read_text())
        runs, machine = saved["runs"], saved["machine"]
        args.bench_args = saved.get("bench_args", args.bench_args)
    elif args.report.exists():
        back, machine = read_back(args.report.read_text(encoding="utf-8"))
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
        runs[name] = run_one(name, plot_dir, extra if name not in OWN_ARGS else [])
    if names or machine is None:
        machine = _machine()
    total = sum(e["seconds"] for e in runs.values())
    if args.save:
        args.save.write_text(
            json.dumps({"runs": runs, "machine": machine, "bench_args": args.bench_args}, indent=1)
        )
    args.report.write_text(render(runs, args.report, machine, total, args.bench_args))
    print(f"wrote {args.report}", file=sys.stderr)
    return 0 if all("result" in e for e in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
