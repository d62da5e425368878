"""The local models chatpage can offer to switch to: those in its cache, in the folders that
config.yaml's ``models_dirs`` names, and the ones loaded before (remembered in the data dir).

Only what looks like a model is offered: a folder with a config.json, or a .gguf file. Nothing
here loads or opens a model; a model listed can still fail to load (the switch says why).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from chatpage.config.paths import cache_dir, data_dir

RECENT_LIMIT = 20
"""How many models loaded before are remembered (the most recent first)."""
DIR_LIMIT = 200
"""At most this many entries of one models folder are looked at."""


@dataclass(frozen=True)
class FoundModel:
    """A model that can be picked: its path and where it was found ("loaded before",
    "cache", or the models folder it is in)."""

    path: str
    origin: str


def recent_path() -> Path:
    """Where the models loaded before are remembered: ``data_dir()/recent_models.json``."""
    return data_dir() / "recent_models.json"


def looks_like_model(path: Path) -> bool:
    """A folder with a config.json, or a .gguf file."""
    if path.is_dir():
        return (path / "config.json").is_file()
    return path.suffix == ".gguf" and path.is_file()


def recent_models() -> list[str]:
    """The models loaded before, the most recent first (a missing or broken file: none)."""
    try:
        data = json.loads(recent_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(data, list):
        return []
    return [p for p in data if isinstance(p, str)][:RECENT_LIMIT]


def remember_model(path: str) -> None:
    """Put ``path`` (a model that loaded) first among the models loaded before. The file is
    replaced whole, so another chatpage reading it never sees half of it; a write that fails
    (a read-only data dir) is skipped: remembering is a convenience."""
    resolved = str(Path(path).expanduser().resolve())
    paths = [resolved] + [p for p in recent_models() if p != resolved]
    target = recent_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".recent-", dir=target.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(paths[:RECENT_LIMIT], f)
        os.replace(tmp, target)
    except OSError:
        return


def _inside(folder: Path) -> list[Path]:
    """The models directly in ``folder`` (it too, when it is one), sorted by name."""
    if looks_like_model(folder):
        return [folder]
    try:
        entries = sorted(folder.iterdir())[:DIR_LIMIT]
    except OSError:
        return []
    return [e for e in entries if not e.name.startswith(".") and looks_like_model(e)]


def find_models(models_dirs: Iterable[str] = ()) -> list[FoundModel]:
    """Every local model to offer, each path once: loaded before (most recent first), then
    each of ``models_dirs`` in order, then the cache (dequantized .gguf copies)."""
    found: list[FoundModel] = []
    seen: set[str] = set()

    def add(path: Path, origin: str) -> None:
        key = str(path.resolve())
        if key not in seen:
            seen.add(key)
            found.append(FoundModel(str(path), origin))

    for text in recent_models():
        path = Path(text)
        if looks_like_model(path):
            add(path, "loaded before")
    for folder in models_dirs:
        for path in _inside(Path(folder).expanduser()):
            add(path, folder)
    for path in _inside(cache_dir() / "models"):
        add(path, "cache")
    return found
