"""Where chatpage keeps its files (XDG base directories)."""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(var: str, fallback: str) -> Path:
    value = os.environ.get(var)
    base = Path(value) if value else Path.home() / fallback
    return base / "chatpage"


def cache_dir() -> Path:
    """Dequantized model copies and built kernels: ``$XDG_CACHE_HOME/chatpage``."""
    return _xdg("XDG_CACHE_HOME", ".cache")


def kv_dir() -> Path:
    """The disk tier of KV blocks (config.yaml's ``kv_disk`` bounds it): ``$CHATPAGE_KV_DIR``,
    else ``cache_dir()/kv``."""
    value = os.environ.get("CHATPAGE_KV_DIR")
    return Path(value) if value else cache_dir() / "kv"


def data_dir() -> Path:
    """The conversation database: ``$XDG_DATA_HOME/chatpage``."""
    return _xdg("XDG_DATA_HOME", ".local/share")


def config_dir() -> Path:
    """config.yaml and user personas: ``$XDG_CONFIG_HOME/chatpage``."""
    return _xdg("XDG_CONFIG_HOME", ".config")


def shipped_personas_dir() -> Path:
    """The personas/ folder shipped with chatpage."""
    return Path(__file__).resolve().parents[2] / "personas"
