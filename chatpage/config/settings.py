"""User configuration: ``config_dir()/config.yaml`` plus command-line overrides.

A bad value never stops the app: it is reported as a one-line warning and the default is used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chatpage.config.mcp import McpServerConfig, parse_mcp_servers
from chatpage.config.paths import config_dir
from chatpage.vocab import (
    BLOCK_SIZES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_DEVICE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_WEIGHTS,
    KV_CACHE_DTYPES,
    WEIGHT_FORMATS,
    check_device_name,
)

SOURCE_DEFAULT = "default"
DEFAULT_BACKEND_TIMEOUT_S = 120.0
"""How long a ``--backend`` server may send nothing before a reply is given up."""
SOURCE_CLI = "command line"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kib": 1 << 10,
    "kb": 10**3,
    "m": 1 << 20,
    "mib": 1 << 20,
    "mb": 10**6,
    "g": 1 << 30,
    "gib": 1 << 30,
    "gb": 10**9,
    "t": 1 << 40,
    "tib": 1 << 40,
    "tb": 10**12,
}
_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)
_SIZE_HELP = (
    "a number of bytes, or a number with K, M or G (also KiB/MiB/GiB, KB/MB/GB), e.g. 512MiB"
)


def parse_size(value: str | int) -> int:
    """Bytes in a size such as ``"512MiB"``, ``"1G"``, ``"1.5GB"``, ``"4096"`` or ``4096``.

    K/M/G and KiB/MiB/GiB are powers of 1024; KB/MB/GB are powers of 1000. Case does not matter.
    Raises ValueError with a one-line message for anything else (negative, empty, unknown unit).
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"invalid size {value!r}: use {_SIZE_HELP}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: a size cannot be negative")
        return value
    match = _SIZE_RE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"invalid size {value!r}: use {_SIZE_HELP}")
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(num_bytes: int) -> str:
    """A short human form of a byte count: ``512 MiB``, ``1.5 GiB``, ``300 B``."""
    size = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            break
        size /= 1024
    text = f"{size:.1f}".removesuffix(".0") if unit != "B" else str(num_bytes)
    return f"{text} {unit}"


@dataclass(frozen=True)
class Settings:
    """The effective configuration; `sources` says where each value came from."""

    model: str | None = None
    kv_cache: int = 1 << 30  # 46k tokens of the default model (bf16 KV on the CPU)
    kv_disk: int = 4 << 30  # the disk tier of KV blocks kept across restarts (0: none)
    block_size: int = DEFAULT_BLOCK_SIZE
    weights: str = DEFAULT_WEIGHTS
    kv_cache_dtype: str = "auto"  # auto | bf16 | int8 (engine/device.py's plan says what auto is)
    device: str = DEFAULT_DEVICE  # auto | cpu | cuda | cuda:N (engine/device.py resolves it)
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION  # of a GPU, for its KV pool
    speculate: str = "auto"  # auto | off: draftless speculative decoding (engine/core/speculate.py)
    default_persona: str = "assistant"
    theme: str = "chatpage"
    bindings: Mapping[str, str] = field(default_factory=dict)
    backend: str | None = None  # an OpenAI-compatible server's URL instead of the local engine
    backend_timeout: float = DEFAULT_BACKEND_TIMEOUT_S  # seconds the server may send nothing
    models_dirs: tuple[str, ...] = ()  # folders whose models the model picker lists
    mcp_servers: Mapping[str, McpServerConfig] = field(default_factory=dict)  # tools (MCP)
    sources: dict[str, str] = field(default_factory=dict, compare=False)


SETTING_KEYS = (
    "model",
    "kv_cache",
    "kv_disk",
    "block_size",
    "weights",
    "kv_cache_dtype",
    "device",
    "gpu_memory_utilization",
    "speculate",
    "default_persona",
    "theme",
    "bindings",
    "backend",
    "backend_timeout",
    "models_dirs",
    "mcp_servers",
)


def _model(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("a path to a model directory or .gguf file, or null for the default model")
    return str(Path(str(value).strip()).expanduser())


def _backend(value: Any) -> str | None:
    if value is None:
        return None
    text = value.strip().rstrip("/") if isinstance(value, str) else ""
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        raise ValueError("a server URL such as http://host:8000, or null for the local engine")
    return text


def parse_seconds(value: Any) -> float:
    """A positive, finite number of seconds; ValueError saying what is expected."""
    if isinstance(value, str):
        value = value.strip().removesuffix("s").strip()
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError("a number of seconds above zero, e.g. 120")
    return float(value)


def _models_dirs(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise ValueError("a list of folders holding model folders or .gguf files, e.g. [~/models]")
    return tuple(str(Path(v.strip()).expanduser()) for v in items)


def _kv_cache(value: Any) -> int:
    try:
        size = parse_size(value)
    except ValueError:
        raise ValueError(_SIZE_HELP) from None
    if size <= 0:
        raise ValueError("a size above zero")
    return size


def _kv_disk(value: Any) -> int:
    try:
        return parse_size(value)
    except ValueError:
        raise ValueError(f"{_SIZE_HELP}; 0 turns the disk tier off") from None


def _block_size(value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or value not in BLOCK_SIZES:
        raise ValueError(" or ".join(str(n) for n in BLOCK_SIZES))
    return int(value)


def _weights(value: Any) -> str:
    if value not in WEIGHT_FORMATS:
        raise ValueError(" or ".join(WEIGHT_FORMATS))
    return value


def _kv_cache_dtype(value: Any) -> str:
    if value not in KV_CACHE_DTYPES:
        raise ValueError(" or ".join(KV_CACHE_DTYPES))
    return value


def _device(value: Any) -> str:
    try:
        return check_device_name(value)
    except ValueError:
        raise ValueError("auto, cpu, cuda or cuda:N") from None


def _utilization(value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError("a fraction above 0 and at most 1, e.g. 0.9")
    return float(value)


def _speculate(value: Any) -> str:
    # (YAML reads a bare off as false and on as true)
    value = {True: "auto", False: "off"}.get(value, value) if isinstance(value, bool) else value
    if value not in ("auto", "off"):
        raise ValueError("auto or off")
    return str(value)


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise ValueError("a non-empty name on one line")
    return value.strip()


def _key_string(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and not any(c.isspace() for c in value)


def _bindings(value: Any, warn: Callable[[str], None], origin: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("a mapping of binding id to key, e.g. {new_chat: ctrl+n}")
    good: dict[str, str] = {}
    for binding_id, key in value.items():
        if not isinstance(binding_id, str) or not _key_string(key):
            warn(
                f"{origin}: bindings.{binding_id} = {key!r} is not a valid key; use a key "
                "name like 'ctrl+n' or 'f2' (several separated by commas, no spaces); ignored"
            )
            continue
        good[binding_id] = key
    return good


_PARSERS: dict[str, Callable[[Any], Any]] = {
    "model": _model,
    "kv_cache": _kv_cache,
    "kv_disk": _kv_disk,
    "block_size": _block_size,
    "weights": _weights,
    "kv_cache_dtype": _kv_cache_dtype,
    "device": _device,
    "gpu_memory_utilization": _utilization,
    "speculate": _speculate,
    "default_persona": _name,
    "theme": _name,
    "backend": _backend,
    "backend_timeout": parse_seconds,
    "models_dirs": _models_dirs,
}


def config_path() -> Path:
    """Where the user's config file lives: ``config_dir()/config.yaml``."""
    return config_dir() / "config.yaml"


def _read_config(path: Path, warn: Callable[[str], None]) -> dict[Any, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        reason = getattr(err, "strerror", None) or "not UTF-8 text"
        warn(f"{path}: cannot read the file ({reason}); using the defaults")
        return {}
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        warn(f"{path}: invalid YAML{where}; fix the syntax; using the defaults")
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        warn(
            f"{path}: expected a mapping of settings (key: value), got a "
            f"{type(data).__name__}; using the defaults"
        )
        return {}
    return data


def load_settings(
    path: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> tuple[Settings, list[str]]:
    """The effective settings: defaults <- config file (`path`, default `config_path()`) <-
    `overrides` (command-line values; a None value means "not given").

    Returns the settings and one-line warnings: an unreadable file, unknown keys, invalid values
    (each falls back to the value from the layer below).
    """
    path = config_path() if path is None else path
    warnings: list[str] = []
    values: dict[str, Any] = {}
    sources = dict.fromkeys(SETTING_KEYS, SOURCE_DEFAULT)
    layers = [(path.name, _read_config(path, warnings.append)), (SOURCE_CLI, overrides or {})]
    for origin, layer in layers:
        for key, raw in layer.items():
            if origin == SOURCE_CLI and raw is None:
                continue
            if key not in SETTING_KEYS:
                warnings.append(
                    f"{origin}: unknown setting {key!r}; known settings are "
                    f"{', '.join(SETTING_KEYS)}; ignored"
                )
                continue
            try:
                value: Any
                if key == "bindings":
                    value = _bindings(raw, warnings.append, origin)
                elif key == "mcp_servers":
                    value = parse_mcp_servers(raw, warnings.append, origin)
                else:
                    value = _PARSERS[key](raw)
            except ValueError as err:
                warnings.append(
                    f"{origin}: {key} = {raw!r} is not valid; expected {err}; "
                    f"using the {sources[key]} value"
                )
                continue
            values[key] = value
            sources[key] = origin
    return Settings(**values, sources=sources), warnings
