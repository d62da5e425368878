"""docs/benchmarks.md: goals and tables of the model-file benchmarks (issue 21): load (per file),
windows, and quality's comparison with llama.cpp on the same GGUF files
(``chatpage/bench/report.py`` renders everything else)."""

from __future__ import annotations

from chatpage.bench.report_single import Add, Table

MB = 1e6
# load's goal on the seconds holds for a file of this size and up (a 0.5B Q4_K_M is ~400-490 MB)
SECONDS_GOAL_BYTES = 300 * MB


def _load_rows(r: dict) -> list[tuple[str, int, dict]]:
    """(file, bytes, result row) of every file and format load measured, the --model first."""
    model = "default model" if r["model"] == "default" else r["model"]
    out = [(model, r["file_bytes"], x) for x in r["results"]]
    for f in r.get("files", []):
        out += [(f["file"], f["file_bytes"], x) for x in f["results"]]
    return out


def _ran(x: dict) -> str:
    """What a load row's pack really runs: the form of most of its matrix bytes (``int4+levels``:
    int4 with a table of levels of its own; ``engine/model/weights.py``'s matrix_formats), else the
    format it asked for."""
    return next(iter(x.get("matrix_formats") or {}), x["weights"])


def goals(results: dict, add: Add) -> None:
    """Add the goals of load (per file), windows and quality against llama.cpp."""
    r = results.get("load")
    if r:
        g = r["goals"]
        for name, size, x in _load_rows(r):
            w = x["weights"]
            if size >= SECONDS_GOAL_BYTES:
                for key, what in (("first_load_s", "first load"), ("cached_load_s", "cached load")):
                    add(
                        "load",
                        f"{what} s, {name} ({_ran(x)})",
                        x[key],
                        f"<= {g[key]:.0f}",
                        x[key] <= g[key],
                        f"{size / MB:.0f} MB file; wall time of load_model in a fresh process "
                        f"(the whole process: {x[key.replace('load', 'process')]:.1f} s)",
                    )
            if w != "int4":
                continue
            add(
                "load",
                f"cache / file, {name} ({_ran(x)})",
                x["cache_ratio"],
                f"<= {g['cache_ratio']}",
                x["cache_ratio"] <= g["cache_ratio"],
                f"{x['cache_bytes'] / MB:.0f} MB packed (tokenizer included) for a "
                f"{size / MB:.0f} MB file",
            )
            gguf = name == "default model" or name.endswith(".gguf")  # (the default is one)
            if gguf and "first_peak_rss_ratio" in g:  # (results of older runs lack it)
                add(
                    "load",
                    f"first-load peak RSS / file, {name} ({_ran(x)})",
                    x["first_peak_rss_ratio"],
                    f"<= {g['first_peak_rss_ratio']:.0f}",
                    x["first_peak_rss_ratio"] <= g["first_peak_rss_ratio"],
                    f"{x['first_peak_rss_bytes'] / MB:.0f} MB for a {size / MB:.0f} MB file: the "
                    "whole process (interpreter, torch, the tokenizer's conversion, the packing)",
                )
            if x.get("rss_bound_bytes"):
                add(
                    "load",
                    f"first-load peak RSS, {name} ({_ran(x)}), MB",
                    x["first_peak_rss_bytes"] / MB,
                    f"<= {x['rss_bound_bytes'] / MB:.0f}",
                    x["first_peak_rss_bytes"] <= x["rss_bound_bytes"],
                    f"the pack ({x['cache_bytes'] / MB:.0f} MB) + 4x the largest tensor in fp32 "
                    f"({x['largest_tensor_fp32_bytes'] / MB:.0f} MB) + 300 MB; the peak (VmHWM) counts "
                    "the interpreter, torch and the file's mapped pages",
                )
    w = results.get("windows")
    if w:
        add(
            "windows",
            f"KV layer-blocks, Gemma 3 shape / full attention, {w['tokens']}-token chat",
            w["ratio"],
            "<= 0.35",
            w["ratio"] <= 0.35,
            f"{w['layer_blocks_sliding']} against {w['layer_blocks_full']} layer-blocks: each "
            f"sliding layer keeps only the blocks of its last {w['window']} tokens",
        )
    q = results.get("quality")
    for f in _llamacpp_files(q or {}):
        own = f["own_format"]
        add(
            "quality",
            f"{own} perplexity vs llama.cpp, {f['file']}",
            f["delta_vs_llamacpp"][own],
            f"<= +{f['goal_delta_vs_llamacpp']:.0%}",
            f["met"],
            f"{f['perplexity'][own]:.2f} against llama.cpp's {f['llamacpp_perplexity']:.2f}; "
            f"{own} is the file's own precision ({_types(f)})",
        )


def _llamacpp_files(q: dict) -> list[dict]:
    return ([q["llamacpp"]] if "llamacpp" in q else []) + q.get("files", [])


def _types(f: dict) -> str:
    total = sum(f["matrix_types"].values())
    return ", ".join(f"{t} {b / total:.0%}" for t, b in f["matrix_types"].items())


def figures(name: str, r: dict, table: Table) -> list[str]:
    """The tables of ``load`` and ``windows`` and quality's llama.cpp part; [] for any other."""
    if name == "load":
        rows = [
            [
                file,
                size / MB,
                _ran(x),
                x["first_load_s"],
                x["cached_load_s"],
                x["first_peak_rss_bytes"] / MB,
                x["cached_peak_rss_bytes"] / MB,
                x["cache_bytes"] / MB,
                x["cache_ratio"],
                x["first_peak_rss_ratio"],
                x["cached_peak_rss_ratio"],
            ]
            for file, size, x in _load_rows(r)
        ]
        out = [
            "Every load a fresh process (`load_model`, wall time; peak RSS is its VmHWM); the "
            "first into an empty cache, the cached one reading what it left. The re-quantized "
            "files are made by llama.cpp's quantizer from an F16 copy of the default model "
            "(`chatpage/bench/requant.py`); the Qwen2.5-0.5B- and Gemma-3-270M-shaped ones hold the "
            "default model's weights tiled to their sizes.",
            "",
            table(
                [
                    "file",
                    "file (MB)",
                    "weights",
                    "first load (s)",
                    "cached load (s)",
                    "first peak RSS (MB)",
                    "cached peak RSS (MB)",
                    "cache (MB)",
                    "cache / file",
                    "first RSS / file",
                    "cached RSS / file",
                ],
                rows,
            ),
        ]
        if "files_error" in r:
            out += ["", f"Re-quantized files not measured: {r['files_error']}"]
        return out
    if name == "windows":
        return [
            f"One {r['tokens']}-token chat through the real block manager, no model run: "
            f"{r['layers']} layers, 5 sliding (window {r['window']}) : 1 full, as Gemma 3 1B; "
            f"block size {r['block_size']}; the peak between steps in layer-blocks.",
            "",
            table(
                ["layout", "layer-blocks held", "ratio"],
                [
                    [f"full attention, {r['layers']} layers", r["layer_blocks_full"], 1.0],
                    ["Gemma 3 shape, sliding blocks freed", r["layer_blocks_sliding"], r["ratio"]],
                ],
            ),
        ]
    if name == "quality":
        files = _llamacpp_files(r)
        if not files:
            return (
                [f"Not compared with llama.cpp: {r['llamacpp_error']}"]
                if r.get("llamacpp_error")
                else []
            )
        formats = list(files[0]["perplexity"])
        rows = [
            [
                f["file"],
                _types(f),
                f["llamacpp_perplexity"],
                *(100 * f["delta_vs_llamacpp"][w] for w in formats),
                f["own_format"],
                "met" if f["met"] else "**missed**",
            ]
            for f in files
        ]
        return [
            "Against llama.cpp (llama-cpp-python, `logits_all`, the same token ids) on the same "
            "file; the re-quantized files made by llama.cpp's quantizer from an F16 copy of the "
            "default model (itself Q4_1, so each is a re-quantization of Q4_1 values). Own "
            "precision: the format of the type holding most matrix bytes (goal <= +1%).",
            "",
            table(
                [
                    "file",
                    "matrix bytes by type",
                    "llama.cpp perplexity",
                    *(f"{w} vs llama.cpp (%)" for w in formats),
                    "own precision",
                    "goal",
                ],
                rows,
            ),
        ]
    return []
