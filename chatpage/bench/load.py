"""`chatpage bench load`: loading a model, first (fresh cache) and cached, in each weight format.

Every load is a fresh process (``python -m chatpage.bench.load --child``) that loads the model
through ``load_model`` and reports its own time and peak RSS (`peak_rss_bytes`: the most host
memory it ever held, interpreter and torch included). The first load of a format runs against an empty cache
folder (``XDG_CACHE_HOME`` pointed at a temporary directory: tokenizer conversion and packing
included); the cached load then reads what it left. Reported with the bytes that cache holds and
the ratios of each figure to the model file's size (a GGUF; for a folder, its weight files).
``--files`` measures more GGUF files the same way (``requant``: the default model re-quantized by
llama.cpp; ``qwen05`` and ``gemma270``: files of Qwen2.5-0.5B's and Gemma 3 270M's sizes, the
goals' sizes (``bench/requant.py``)).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatpage.bench import common, requant
from chatpage.bench.reporting import Goal, Section, at_most, reader, table
from chatpage.engine.model import ops

# Goals of issue 21 for a GGUF (a 0.5B Q4_K_M file on this kind of machine for the seconds).
GOALS = {"first_load_s": 15.0, "cached_load_s": 2.0, "cache_ratio": 1.3}
# issue 39: a GGUF's first load peaks at 3x the file at most (the whole process's RSS)
GOALS["first_peak_rss_ratio"] = 3.0
RSS_SLACK = 300_000_000  # the + 300 MB of the host-memory bound


def _child(model: str | None, weights: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    from chatpage.engine.load.loader import load_model

    loaded = load_model(model, progress=lambda _m: None, weights=weights)
    seconds = time.perf_counter() - t0
    rss = peak_rss_bytes()
    from chatpage.engine.model.weights import matrix_formats

    return {
        "load_s": seconds,
        "peak_rss_bytes": rss,
        "tensors": len(loaded.state),
        "matrix_formats": matrix_formats(loaded.state),
    }


def peak_rss_bytes() -> int:
    """This process's peak resident memory: Linux's VmHWM (of this program alone: ru_maxrss
    keeps the parent's peak across fork and exec, so a child of a big bench process would
    report that), else ru_maxrss."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux counts KiB


def _load(model: str | None, weights: str, cache: Path) -> dict[str, Any]:
    """One load in a fresh process with ``cache`` as its XDG cache: its figures and wall time."""
    cmd = [sys.executable, "-m", "chatpage.bench.load", "--child", "--weights", weights]
    if model:
        cmd += ["--model", model]
    # the fresh cache is the model's: the kernels stay where they were built (not timed here)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), ops.ENV_CACHE: str(ops.cache_root())}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if done.returncode != 0:
        lines = (done.stderr.strip() or "no output").splitlines()
        raise SystemExit(f"chatpage: error: the {weights} load failed: {lines[-1]}")
    return {
        **json.loads(done.stdout.strip().splitlines()[-1]),
        "process_s": time.perf_counter() - t0,
    }


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def source_bytes(model: str | None) -> int:
    """Bytes of the model as the user has it: the GGUF file, or a folder's weight files."""
    from chatpage.engine.load.loader import default_model_path

    path = default_model_path() if model is None else Path(model).expanduser()
    if path.is_file():
        return path.stat().st_size
    return sum(
        f.stat().st_size
        for f in path.iterdir()
        if f.suffix in (".safetensors", ".bin") and f.is_file()
    )


def largest_tensor_bytes(model: str | None) -> int | None:
    """Bytes of the GGUF's largest tensor in fp32 (None for a folder): issue 21's RSS bound is
    the pack + 4x that + 300 MB."""
    from chatpage.engine.load.gguf_file import GGUFFile
    from chatpage.engine.load.loader import default_model_path

    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.is_file():
        return None
    return max(4 * math.prod(t.shape) for t in GGUFFile(path).tensors.values())


def measure(model: str | None, weights: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="chatpage-bench-load-") as tmp:
        cache = Path(tmp)
        first = _load(model, weights, cache)
        cached = _load(model, weights, cache)
        # the packs (models/) and a GGUF's tokenizer (tokenizers/): what a first load left
        cache_bytes = sum(
            _bytes(d)
            for d in (cache / "chatpage" / "models", cache / "chatpage" / "tokenizers")
            if d.is_dir()
        )
    size = source_bytes(model)
    largest = largest_tensor_bytes(model)
    bound = None if largest is None else cache_bytes + 4 * largest + RSS_SLACK
    return {
        "weights": weights,
        # how the pack stores the matrices (bytes by form, largest first): what really runs
        "matrix_formats": cached["matrix_formats"],
        "first_load_s": first["load_s"],
        "first_process_s": first["process_s"],
        "cached_load_s": cached["load_s"],
        "cached_process_s": cached["process_s"],
        "first_peak_rss_bytes": first["peak_rss_bytes"],
        "cached_peak_rss_bytes": cached["peak_rss_bytes"],
        "cache_bytes": cache_bytes,
        "cache_ratio": cache_bytes / size,
        "first_peak_rss_ratio": first["peak_rss_bytes"] / size,
        "cached_peak_rss_ratio": cached["peak_rss_bytes"] / size,
        "largest_tensor_fp32_bytes": largest,
        "rss_bound_bytes": bound,
    }


def measure_all(model: str | None, formats: list[str]) -> list[dict[str, Any]]:
    rows = []
    for fmt in formats:
        common.say(
            f"{model or 'default'} in {fmt}: a first load into an empty cache, then a cached one"
        )
        rows.append(measure(model, fmt))
    return rows


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = {
        "benchmark": "load",
        "model": args.model or "default",
        "file_bytes": source_bytes(args.model),
        "results": measure_all(args.model, args.weights),
        "goals": GOALS,
    }
    if args.files:
        from chatpage.engine.load.loader import default_model_path

        model = default_model_path() if args.model is None else Path(args.model).expanduser()
        try:
            files = requant.named_files(args.files)
        except requant.MissingPeer as e:
            out["files_error"] = str(e)
            return out
        out["files"] = [
            {
                "file": f.name,
                "file_bytes": f.stat().st_size,
                "results": measure_all(str(f), args.weights),
            }
            for f in files
            if f.resolve() != model.resolve()
        ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = common.parser("load", __doc__.splitlines()[0], default_scale=1.0)
    p.add_argument(
        "--weights",
        type=common.weight_formats,
        default=["int4"],
        help="comma-separated weight formats (default: int4, the default format)",
    )
    p.add_argument(
        "--files",
        default="",
        help="more GGUF files to measure, comma-separated: " + requant.NAMES_HELP,
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = common.parse(p, argv)
    if args.child:
        print(json.dumps(_child(args.model, args.weights[0])), flush=True)
        return 0
    return common.emit(common.round_floats(run(args)), args.json)


# -- the report ----------------------------------------------------------------------------------
MB = 1e6
# the goals on the seconds hold for a file of this size and up (a 0.5B Q4_K_M is ~400-490 MB)
SECONDS_GOAL_BYTES = 300 * MB


@dataclass(frozen=True)
class LoadFigures:
    """One file loaded in one weight format (:func:`measure`)."""

    weights: str
    first_load_s: float
    first_process_s: float
    cached_load_s: float
    cached_process_s: float
    first_peak_rss_bytes: float
    cached_peak_rss_bytes: float
    cache_bytes: float
    cache_ratio: float
    first_peak_rss_ratio: float
    cached_peak_rss_ratio: float
    largest_tensor_fp32_bytes: float | None = None
    rss_bound_bytes: float | None = None
    matrix_formats: dict[str, float] | None = None

    @property
    def ran(self) -> str:
        """What the pack really runs: the form of most of its matrix bytes (``int4+levels``:
        int4 with a table of levels of its own; ``engine/model/weights.py``'s matrix_formats),
        else the format it asked for."""
        return next(iter(self.matrix_formats or {}), self.weights)


@dataclass(frozen=True)
class FileLoads:
    file: str
    file_bytes: float
    results: list[LoadFigures]


@dataclass(frozen=True)
class LoadGoals:
    """The goals as the run recorded them (older runs lack the RSS ratio's)."""

    first_load_s: float
    cached_load_s: float
    cache_ratio: float
    first_peak_rss_ratio: float | None = None


@dataclass(frozen=True)
class LoadResult:
    """What the report reads of a run's JSON."""

    model: str
    file_bytes: float
    results: list[LoadFigures]
    goals: LoadGoals
    files: list[FileLoads] = field(default_factory=list)
    files_error: str | None = None

    def rows(self) -> list[tuple[str, float, LoadFigures]]:
        """(file, bytes, figures) of every file and format measured, the --model first."""
        model = "default model" if self.model == "default" else self.model
        out = [(model, self.file_bytes, x) for x in self.results]
        for f in self.files:
            out += [(f.file, f.file_bytes, x) for x in f.results]
        return out


def goals(r: LoadResult) -> list[Goal]:
    """Per file: the seconds (at the goals' size), the cache and the first load's peak RSS."""
    g = r.goals
    rows: list[Goal] = []
    for name, size, x in r.rows():
        if size >= SECONDS_GOAL_BYTES:
            for key, what in (("first_load_s", "first load"), ("cached_load_s", "cached load")):
                rows.append(
                    at_most(
                        "load",
                        f"{what} s, {name} ({x.ran})",
                        getattr(x, key),
                        getattr(g, key),
                        f"{size / MB:.0f} MB file; wall time of load_model in a fresh process "
                        f"(the whole process: {getattr(x, key.replace('load', 'process')):.1f} s)",
                        spec=".0f",
                    )
                )
        if x.weights == "int4":
            rows += _int4_goals(name, size, x, g)
    return rows


def _int4_goals(name: str, size: float, x: LoadFigures, g: LoadGoals) -> list[Goal]:
    rows = [
        Goal(
            "load",
            f"cache / file, {name} ({x.ran})",
            x.cache_ratio,
            f"<= {g.cache_ratio}",
            x.cache_ratio <= g.cache_ratio,
            f"{x.cache_bytes / MB:.0f} MB packed (tokenizer included) for a "
            f"{size / MB:.0f} MB file",
        )
    ]
    gguf = name == "default model" or name.endswith(".gguf")  # (the default is one)
    if gguf and g.first_peak_rss_ratio is not None:
        rows.append(
            at_most(
                "load",
                f"first-load peak RSS / file, {name} ({x.ran})",
                x.first_peak_rss_ratio,
                g.first_peak_rss_ratio,
                f"{x.first_peak_rss_bytes / MB:.0f} MB for a {size / MB:.0f} MB file: the "
                "whole process (interpreter, torch, the tokenizer's conversion, the packing)",
                spec=".0f",
            )
        )
    if x.rss_bound_bytes and x.largest_tensor_fp32_bytes is not None:
        rows.append(
            at_most(
                "load",
                f"first-load peak RSS, {name} ({x.ran}), MB",
                x.first_peak_rss_bytes / MB,
                x.rss_bound_bytes / MB,
                f"the pack ({x.cache_bytes / MB:.0f} MB) + 4x the largest tensor in fp32 "
                f"({x.largest_tensor_fp32_bytes / MB:.0f} MB) + 300 MB; the peak (VmHWM) "
                "counts the interpreter, torch and the file's mapped pages",
                spec=".0f",
            )
        )
    return rows


def figures(r: LoadResult) -> list[str]:
    rows = [
        [
            file,
            size / MB,
            x.ran,
            x.first_load_s,
            x.cached_load_s,
            x.first_peak_rss_bytes / MB,
            x.cached_peak_rss_bytes / MB,
            x.cache_bytes / MB,
            x.cache_ratio,
            x.first_peak_rss_ratio,
            x.cached_peak_rss_ratio,
        ]
        for file, size, x in r.rows()
    ]
    header = ["file", "file (MB)", "weights", "first load (s)", "cached load (s)"]
    header += ["first peak RSS (MB)", "cached peak RSS (MB)", "cache (MB)", "cache / file"]
    out = [
        "Every load a fresh process (`load_model`, wall time; peak RSS is its VmHWM); the "
        "first into an empty cache, the cached one reading what it left. The re-quantized "
        "files are made by llama.cpp's quantizer from an F16 copy of the default model "
        "(`chatpage/bench/requant.py`); the Qwen2.5-0.5B- and Gemma-3-270M-shaped ones hold the "
        "default model's weights tiled to their sizes.",
        "",
        table([*header, "first RSS / file", "cached RSS / file"], rows),
    ]
    if r.files_error is not None:
        out += ["", f"Re-quantized files not measured: {r.files_error}"]
    return out


# each of the default model's re-quantizations and the 0.5B- and 270M-shaped files too
SECTION = Section(reader(LoadResult), goals, figures, args=("--files", "requant,qwen05,gemma270"))


if __name__ == "__main__":
    raise SystemExit(main())
