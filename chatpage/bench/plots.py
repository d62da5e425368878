"""PNG plots of the benchmark results (matplotlib, from the ``bench`` extra).

Each function takes a benchmark's result dict and a path, writes the figure, and returns the path,
or None (with a note on stderr) when matplotlib is not installed: plots never fail a benchmark.
"""

from __future__ import annotations

from pathlib import Path

from chatpage.bench.common import say


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        say("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str) -> str:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def memory(result: dict, path: str) -> str | None:
    """Figure 2: share of KV memory holding live token states, per policy, with mean batches."""
    plt = _pyplot()
    if plt is None:
        return None
    names = ["Max", "Pow2", "Oracle", "chatpage"]
    keys = ["max", "pow2", "oracle", "chatpage"]
    util = [100 * result[f"{k}_utilization"] for k in keys]
    batch = [result[f"{k}_mean_batch"] for k in keys]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    bars = a.bar(names, util, color=["#bbb", "#999", "#777", "#2a7"])
    a.bar_label(bars, fmt="%.1f%%")
    a.set_ylim(0, 110)
    a.set_ylabel("KV memory holding token states (%)")
    a.set_title("KV memory utilization")
    bars = b.bar(names, batch, color=["#bbb", "#999", "#777", "#2a7"])
    b.bar_label(bars, fmt="%.1f")
    b.set_ylim(0, max(batch) * 1.15)
    b.set_ylabel("mean running requests")
    b.set_title(f"Batch size ({result['kv_budget_tokens']} KV tokens)")
    return _save(plt, fig, path)


def serve(result: dict, path: str) -> str | None:
    """Figure 12: normalized latency against request rate, chatpage vs Oracle reservations."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for system, style in (("chatpage", "o-"), ("oracle", "s--")):
        rows = [r for r in result["rates"] if r["system"] == system]
        ax.plot(
            [r["rate"] for r in rows],
            [r["normalized_latency_s"] for r in rows],
            style,
            label="chatpage" if system == "chatpage" else "Oracle reservation",
        )
    ax.axhline(result["latency_bound_s"], color="#c33", lw=0.8, ls=":", label="latency bound")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("normalized latency (s/token)")
    ax.set_title(f"Serving ({result['workload']}-shaped, {result['kv_blocks']} KV blocks)")
    ax.legend()
    return _save(plt, fig, path)


def sharing(result: dict, path: str) -> str | None:
    """Figure 15: memory saving of parallel sampling and beam search by width."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, workload in zip(axes, ("alpaca", "sharegpt"), strict=True):
        for mode, style in (("parallel", "o-"), ("beam", "s-")):
            rows = [r for r in result["results"] if r["workload"] == workload and r["mode"] == mode]
            ax.plot(
                [r["width"] for r in rows],
                [100 * r["saving"] for r in rows],
                style,
                label="parallel sampling" if mode == "parallel" else "beam search",
            )
        ax.set_title(f"{workload}-shaped")
        ax.set_xlabel("n / beam width")
        ax.set_xticks([2, 4, 6])
    axes[0].set_ylabel("memory saving (%)")
    axes[0].legend()
    return _save(plt, fig, path)


def throughput(result: dict, path: str) -> str | None:
    """Useful output tokens per second: chatpage, transformers (and llama.cpp when measured)."""
    plt = _pyplot()
    if plt is None:
        return None
    formats = [f for f in result.get("formats", []) if f["weights"] != "fp32"]
    names = [
        "chatpage",
        *(f"chatpage\n({f['weights']})" for f in formats),
        f"transformers\n(batch {result['hf_batch']})",
    ]
    values = [result["chatpage_tok_s"], *(f["tok_s"] for f in formats), result["hf_tok_s"]]
    for key, label in (
        ("llamacpp_serial_tok_s", "llama.cpp\nserial"),
        ("llamacpp_batched_tok_s", "llama.cpp\nbatched"),
        ("gemm_bound_tok_s", "GEMM bound\n(batch 128)"),
    ):
        if key in result:
            names.append(label)
            values.append(result[key])
    fig, ax = plt.subplots(figsize=(7, 3.6))
    green = 1 + len(formats)
    bars = ax.bar(names, values, color=["#2a7"] * green + ["#999"] * (len(values) - green))
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Throughput, {result['requests']} ShareGPT-shaped requests")
    return _save(plt, fig, path)


def prefix(result: dict, path: str) -> str | None:
    """Prompt tokens computed per turn of a conversation against the prompt's length."""
    plt = _pyplot()
    if plt is None:
        return None
    turns = result["turns"]
    xs = [t["turn"] for t in turns]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(xs, [t["prompt_tokens"] for t in turns], "o-", label="prompt tokens")
    ax.plot(xs, [t["computed_tokens"] for t in turns], "s-", label="computed (prefilled)")
    ax.plot(xs, [t["new_tokens"] for t in turns], "x:", label="new tokens")
    ax.set_xlabel("turn")
    ax.set_ylabel("tokens")
    ax.set_title(f"Multi-turn reuse (TTFT cached/cold {result['ttft_ratio']:.2f})")
    ax.legend()
    return _save(plt, fig, path)
