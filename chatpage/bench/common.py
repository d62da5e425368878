"""What every benchmark shares: the command line, loading the model once, engines over it, timing,
and the one-JSON-line output contract (progress on stderr, the JSON object last on stdout)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from chatpage.engine import EngineConfig, LLMEngine
from chatpage.engine.device import DeviceError, plan_engine, probe_cuda, resolve_device
from chatpage.engine.load.loader import LoadedModel, load_model
from chatpage.engine.model import ops
from chatpage.engine.model.kv_cache import bytes_per_block


def say(message: str) -> None:
    """Progress line on stderr (stdout is reserved for the JSON result)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def parser(prog: str, description: str, default_scale: float) -> argparse.ArgumentParser:
    """The arguments every benchmark accepts: --json, --scale, --model, --seed."""
    p = argparse.ArgumentParser(prog=f"chatpage bench {prog}", description=description)
    p.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON line (default: readable text)",
    )
    p.add_argument(
        "--scale",
        type=float,
        default=default_scale,
        help=f"shrink lengths and counts (default {default_scale})",
    )
    p.add_argument("--model", default=None, help="HF model directory or .gguf (default model)")
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for every system measured (default: torch's default)",
    )
    add_device_arg(p)
    return p


def add_device_arg(p: argparse.ArgumentParser) -> None:
    """``--device``: where the engines of a benchmark run (the CPU unless asked)."""
    p.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="auto, cpu, cuda or cuda:N (default cpu: the figures are the CPU's)",
    )


def device(p: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """``args.device`` resolved ("auto" -> "cuda:0" or "cpu"); a missing GPU is a usage error."""
    try:
        return resolve_device(args.device, probe_cuda()).device
    except DeviceError as e:
        p.error(str(e))


def weight_formats(value: str) -> list[str]:
    """argparse type of ``--weights``: comma-separated weight formats (engine/model/weights.py)."""
    from chatpage.vocab import WEIGHT_FORMATS

    formats = [f.strip() for f in value.split(",") if f.strip()]
    unknown = sorted(set(formats) - set(WEIGHT_FORMATS))
    if unknown or not formats:
        named = ", ".join(unknown) or repr(value)
        raise argparse.ArgumentTypeError(
            f"unknown weight format(s) {named}; use {', '.join(WEIGHT_FORMATS)}"
        )
    return formats


def parse(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate the common arguments; applies --threads."""
    args = p.parse_args(argv)
    global DEVICE
    DEVICE = device(p, args)
    if not 0 < args.scale <= 4:
        p.error(f"--scale must be in (0, 4], got {args.scale}")
    if args.threads is not None:
        if args.threads < 1:
            p.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    return args


def now() -> float:
    """The benchmarks' clock: process CPU time when torch runs on one thread, else wall time.

    On one thread a step's CPU time is its wall time on an idle machine, and other processes on a
    shared machine do not inflate it; with several threads CPU time would add them up.
    """
    return time.process_time() if torch.get_num_threads() == 1 else time.perf_counter()


def clock_name() -> str:
    return "cpu" if torch.get_num_threads() == 1 else "wall"


def emit(result: dict, as_json: bool) -> int:
    """Print ``result``: one JSON line (``--json``) or readable text; returns the exit status."""
    if as_json:
        print(json.dumps(result), flush=True)
    else:
        print("\n".join(human_lines(result)), flush=True)
    return 0


def human_lines(value, indent: str = "") -> list[str]:
    """``value`` (a JSON-able result) as indented ``key: value`` lines."""
    lines: list[str] = []
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, v in items:
        label = f"{key}:" if isinstance(value, dict) else "-"
        if isinstance(v, (dict, list)) and v:
            if isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v):
                lines.append(f"{indent}{label} {', '.join(map(str, v))}")
            else:
                lines.append(f"{indent}{label}")
                lines += human_lines(v, indent + "  ")
        else:
            lines.append(f"{indent}{label} {v}")
    return lines


def load(model: str | None) -> LoadedModel:
    say(f"loading {model or 'the default model'}")
    return load_model(model, progress=say)


def transformers_model(directory: Path | None, gguf: Path | None, dtype: torch.dtype) -> Any:
    """transformers' own model of the same weights, the side the benchmarks compare with: read
    from ``gguf`` (dequantized by transformers) when the model came from a .gguf file, since its
    cache folder holds only the tokenizer, else from the HF ``directory``."""
    from transformers import AutoModelForCausalLM

    if gguf is not None:
        return AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
    if directory is None:
        raise ValueError("transformers needs the model on disk: give an HF folder or a .gguf")
    return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)


def block_bytes(loaded: LoadedModel, block_size: int = 16, dtype=torch.float32) -> int:
    """Bytes of one KV block of ``loaded``'s model (all layers, K and V)."""
    c = loaded.config
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return bytes_per_block(c.num_hidden_layers, block_size, kv_heads, head_dim, dtype)


DEVICE = "cpu"
"""Where :func:`engine` puts its engines: the parsed ``--device`` (:func:`parse`)."""


def engine(loaded: LoadedModel, *, blocks: int | None = None, **config) -> LLMEngine:
    """A fresh engine over the already loaded weights (the loaded state is left intact), on
    :data:`DEVICE` unless ``config`` names a device.

    ``blocks`` sizes the KV pool in blocks instead of bytes (blocks of the KV dtype the engine
    will run with: its plan's).
    """
    config.setdefault("device", DEVICE)
    config.setdefault("dtype", "auto")  # float32 on the CPU; bf16 KV and matmuls on a GPU
    cfg = EngineConfig(**config)
    if blocks is not None:
        plan = plan_engine(
            cfg.device, cfg.dtype, cfg.weight_dtype, probe_cuda(), cfg.kv_cache_dtype
        )
        kv_dtype = getattr(torch, plan.kv_dtype)
        cfg = replace(cfg, kv_cache_bytes=blocks * block_bytes(loaded, cfg.block_size, kv_dtype))
    return LLMEngine(replace(loaded, state=dict(loaded.state)), cfg)


def model_info(loaded: LoadedModel) -> dict:
    return {
        "model": loaded.name,
        "threads": torch.get_num_threads(),
        "dtype": "float32",
        "clock": clock_name(),
        "vector_isa": ops.vector_isa(),  # the kernels' vector paths: the figures depend on them
    }


def median_s(fn: Callable[[], object], repeats: int = 7, warmup: int = 1) -> float:
    """Median time of ``fn`` in seconds (by :func:`clock`)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = now()
        fn()
        times.append(now() - t0)
    return statistics.median(times)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def live_tokens(eng: LLMEngine) -> int:
    """Token states held in the device KV cache by running sequences right now."""
    tables = eng.bm.tables  # swapped groups are not in ``running``
    return sum(
        seq.num_computed_tokens
        for group in eng.scheduler.running
        for seq in group.seqs
        if seq.seq_id in tables
    )


def drain(eng: LLMEngine, on_step: Callable[[LLMEngine, list], None] | None = None) -> int:
    """Step ``eng`` until every request has finished; returns the number of steps."""
    steps = 0
    while eng.has_unfinished():
        outs = eng.step()
        steps += 1
        if on_step is not None:
            on_step(eng, outs)
    return steps


def round_floats(obj, digits: int = 4):
    """Round every float of a JSON-able structure (readable reports)."""
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: round_floats(v, digits) for k, v in obj.items()}
    if isinstance(obj, list):
        return [round_floats(v, digits) for v in obj]
    return obj


def record_batches(eng: LLMEngine) -> list[tuple[int, int]]:
    """Log (sequences, tokens) of every step ``eng`` schedules from now on; returns the log."""
    log: list[tuple[int, int]] = []
    inner = eng.scheduler.schedule

    def schedule():
        out = inner()
        log.append((len(out.scheduled), out.num_tokens))
        return out

    eng.scheduler.schedule = schedule  # type: ignore[method-assign]  # (this engine's only)
    return log
