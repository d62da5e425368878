"""What the subcommands share: settings with command-line overrides, the engine's config, and
how text and tables are printed."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chatpage.config.settings import (
    DEFAULT_BACKEND_TIMEOUT_S,
    load_settings,
    parse_seconds,
    parse_size,
)
from chatpage.vocab import KV_CACHE_DTYPES, WEIGHT_FORMATS, check_device_name


def size_arg(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_arg(value: str) -> float:
    try:
        return parse_seconds(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {value!r}: use {e}") from None


def add_backend_args(parser: argparse.ArgumentParser, what: str) -> None:
    """--backend URL (``what``: its help) and --backend-timeout SECONDS."""
    parser.add_argument("--backend", metavar="URL", help=what)
    parser.add_argument(
        "--backend-timeout",
        type=seconds_arg,
        metavar="SECONDS",
        help="give a reply up when the server sends nothing for this long "
        f"(default {DEFAULT_BACKEND_TIMEOUT_S:g}, or backend_timeout in "
        "config.yaml)",
    )


def threads_arg(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"invalid thread count {value!r}: use a whole number >= 1")
    return int(value)


def device_arg(value: str) -> str:
    try:
        return check_device_name(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def fraction_arg(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise argparse.ArgumentTypeError(
            f"invalid fraction {value!r}: use a number above 0 and at most 1, e.g. 0.9"
        )
    return share


def add_device_arg(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--device auto|cpu|cuda|cuda:N`` (None: config.yaml's, else auto)."""
    parser.add_argument(
        "--device",
        type=device_arg,
        default=default,
        metavar="DEVICE",
        help="where the engine runs: auto (the first CUDA GPU, else the CPU), "
        "cpu, cuda or cuda:N (default: "
        f"{default or 'auto, or config.yaml'})",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """The engine flags of the TUI, `ask` and `serve`: --weights, --kv-cache-dtype, --threads,
    --device, --gpu-memory-utilization, --kv-disk and --speculate."""
    parser.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        help="storage of the model's weights (default: int4, or config.yaml)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="storage of the KV cache: int8 holds twice the tokens of bf16 (default: auto, "
        "what the engine measured best here, or config.yaml)",
    )
    add_device_arg(parser)
    parser.add_argument(
        "--gpu-memory-utilization",
        type=fraction_arg,
        metavar="FRACTION",
        help="share of the GPU's memory for the weights, activations and KV "
        "pool (default: 0.9, or config.yaml)",
    )
    parser.add_argument(
        "--kv-disk",
        type=size_arg,
        metavar="SIZE",
        help="bound of the KV disk tier, prompts prefilled once and kept across restarts "
        "(default: 4GiB, or config.yaml; 0: off)",
    )
    parser.add_argument(
        "--speculate",
        choices=("auto", "off"),
        help="draftless speculative decoding: drafts from the text already there, verified "
        "in one step, output unchanged (default: auto, or config.yaml)",
    )
    parser.add_argument(
        "--threads",
        type=threads_arg,
        metavar="N",
        help="torch threads for the engine (default: every core)",
    )


def load_with_overrides(args):
    return load_settings(
        overrides={
            "model": getattr(args, "model", None),
            "kv_cache": getattr(args, "kv_cache", None),
            "kv_disk": getattr(args, "kv_disk", None),
            "backend": getattr(args, "backend", None),
            "backend_timeout": getattr(args, "backend_timeout", None),
            "weights": getattr(args, "weights", None),
            "kv_cache_dtype": getattr(args, "kv_cache_dtype", None),
            "device": getattr(args, "device", None),
            "gpu_memory_utilization": getattr(args, "gpu_memory_utilization", None),
            "speculate": getattr(args, "speculate", None),
        }
    )


def device_error(settings) -> str | None:
    """The one-line error for a device (``--device`` or config.yaml) naming a GPU this machine
    does not have; None for auto, cpu or a remote backend (those never fail: no torch import)."""
    if settings.backend or not settings.device.startswith("cuda"):
        return None
    from chatpage.engine.device import DeviceError, probe_cuda, resolve_device

    try:
        resolve_device(settings.device, probe_cuda())
    except DeviceError as e:
        return str(e)
    return None


def remote_client(settings):
    """The client of ``settings.backend`` (an OpenAI-compatible server), not started."""
    try:
        from chatpage.remote.client import RemoteEngineClient
    except ImportError as e:
        print(
            f"chatpage: error: --backend needs the serve extra ({e.name} is missing); install "
            "it with: pip install 'chatpage[serve]'",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return RemoteEngineClient(settings.backend, timeout_s=settings.backend_timeout)


def settings_or_warn(args):
    settings, warnings = load_with_overrides(args)
    for w in warnings:
        print(f"chatpage: warning: {w}", file=sys.stderr)
    return settings


def one_line(text: str) -> str:
    """Text safe to print on one terminal line: no control characters or escape sequences."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def print_table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], out: Callable[[str], Any] = print
) -> None:
    """Columns padded to their widest cell; the last column is left ragged."""
    rows = [list(headers)] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        out("  ".join(cells + [row[-1]]).rstrip())
