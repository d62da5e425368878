"""`chatpage config`: every effective setting, its value and where it came from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatpage.cli.common import one_line, print_table
from chatpage.config.settings import SETTING_KEYS, Settings, config_path, format_size, load_settings

_FILE_ONLY = ("bindings", "mcp_servers")
"""Settings only config.yaml sets (no command-line flag)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `config` to a parser. It also honours, when the main parser defines them,
    ``args.config_file`` (another config.yaml) and command-line overrides named like the
    settings (``args.kv_cache``, ``args.model``, ...; None = unset)."""
    config = subparsers.add_parser(
        "config",
        help="show the effective settings",
        description="Show each setting, its value and where it came from, plus any warnings.",
    )
    config.set_defaults(func=cmd_config)


def _describe(key: str, settings: Settings) -> str:
    value = getattr(settings, key)
    if key == "model":
        return (value or "(the default model)") + _model_kind(value)
    if key == "backend" and value is None:
        return "(the local engine)"
    if key == "backend_timeout":
        return f"{value:g} s"
    if key == "kv_cache":
        return f"{format_size(value)} ({value} bytes)"
    if key == "kv_disk":
        return f"{format_size(value)} ({value} bytes)" if value else "0 (no KV disk tier)"
    if key == "bindings":
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    if key == "mcp_servers":
        return ", ".join(f"{k} ({v.describe()})" for k, v in value.items()) or "(none)"
    if key == "device":
        return f"{value} -> {_resolved(value)}"
    return str(value)


def _model_kind(model: str | None) -> str:
    """The note " (a base model: ...)" for a model without a chat template of its own (read
    from its files, not loaded); "" otherwise."""
    from chatpage.engine.load.loader import has_chat_template  # imports torch

    if has_chat_template(model) is not False:
        return ""
    return " (a base model: no chat template; chats use the plain 'User: ... Assistant:' format)"


def _resolved(device: str) -> str:
    """Where ``device`` puts the engine on this machine, or the one-line reason it cannot."""
    from chatpage.engine.device import DeviceError, probe_cuda, resolve_device  # imports torch

    try:
        return resolve_device(device, probe_cuda()).why
    except DeviceError as e:
        return f"error: {e}"


def cmd_config(args: argparse.Namespace) -> int:
    """Print every effective setting with its value and source, then warnings on stderr."""
    path = getattr(args, "config_file", None) or config_path()
    overrides = {key: getattr(args, key, None) for key in SETTING_KEYS if key not in _FILE_ONLY}
    settings, warnings = load_settings(Path(path), overrides)
    print(f"config file: {path}" + ("" if Path(path).exists() else " (not found)"))
    print_table(
        ("SETTING", "SOURCE", "VALUE"),
        ((key, settings.sources[key], _describe(key, settings)) for key in SETTING_KEYS),
    )
    for warning in warnings:
        print(f"chatpage: warning: {one_line(warning)}", file=sys.stderr)
    return 0
