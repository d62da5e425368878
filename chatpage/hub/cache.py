"""The models pulled: what huggingface_hub's cache holds that chatpage can run, read from the disk
only (no network), for `chatpage models`, the TUI's picker and ``--model REPO[:QUANT]``.

A GGUF repo gives one model per quant cached (a split model only with all its parts); a repo
with a config.json and safetensors gives one model, its snapshot folder. Other repos of the
cache (a tokenizer transformers fetched, a dataset) are not models and are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import (
    CachedIncompleteFileInfo,
    CachedRepoInfo,
    CachedRevisionInfo,
    scan_cache_dir,
)
from huggingface_hub.errors import CacheNotFound

from chatpage.hub.pull import hub_cache
from chatpage.hub.refs import (
    DEFAULT_QUANTS,
    HubError,
    ModelRef,
    gguf_models,
    hf_files,
    is_hf_model,
    parse_ref,
    quant_of,
)


@dataclass(frozen=True)
class PulledModel:
    """A model in the cache: how to name it (``REPO[:QUANT]``), the path the loader opens (the
    .gguf file, a split model's first part, or the snapshot folder), its files' snapshot paths,
    and its size on disk."""

    ref: ModelRef
    path: Path
    files: tuple[Path, ...]
    size: int
    revision: str


def pulled_models() -> list[PulledModel]:
    """Every model in the cache, by repo; from a repo's newest revision where several have it."""
    models: list[PulledModel] = []
    for repo in _model_repos():
        seen: set[Path] = set()  # a model's first file, within the snapshot
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True):
            for model in _revision_models(repo.repo_id, revision):
                first = model.files[0].relative_to(revision.snapshot_path)
                if first not in seen:
                    seen.add(first)
                    models.append(model)
    return models


def find_pulled(text: str) -> PulledModel | None:
    """The cached model ``text`` (``REPO[:QUANT]``) names, picked as a pull picks (the quant
    asked for; else the safetensors model, Q4_K_M, Q8_0, the first); None if not cached."""
    ref = parse_ref(text)
    if ref is None:
        return None
    models = [m for m in pulled_models() if m.ref.repo.lower() == ref.repo.lower()]
    wanted = (ref.quant.upper(),) if ref.quant else (None, *DEFAULT_QUANTS)
    for quant in wanted:
        for model in models:
            if model.ref.quant == quant and (quant or model.path.is_dir()):
                return model
    return models[0] if models and ref.quant is None else None


def run_name(repo: str, path: Path) -> str:
    """What ``--model`` (and the TUI's /model) takes for the model of ``repo`` pulled to
    ``path``: ``REPO[:QUANT]`` where that names it, else the path."""
    quant = quant_of(path.name) if path.suffix == ".gguf" else None
    name = f"{repo}:{quant}" if quant else repo
    pulled = find_pulled(name)
    return name if pulled is not None and pulled.path == path else str(path)


def remove_pulled(text: str) -> tuple[list[PulledModel], int]:
    """Delete the cached model ``text`` names, or every model of the repo and its interrupted
    pulls when ``text`` names no quant; the models removed, and the bytes of interrupted pulls.
    A repo left with no model goes whole (huggingface_hub's own delete); otherwise the model's
    files, and their blobs unless another snapshot links them."""
    ref = parse_ref(text)
    if ref is None:
        raise HubError(f"{text!r} is not a Hugging Face model: use OWNER/NAME[:QUANT]")
    repo_models = [m for m in pulled_models() if m.ref.repo.lower() == ref.repo.lower()]
    gone = [
        m
        for m in repo_models
        if ref.quant is None or (m.ref.quant or "").lower() == ref.quant.lower()
    ]
    partial = [
        f
        for repo, files in _partial_files().items()
        if ref.quant is None and repo.lower() == ref.repo.lower()
        for f in files
    ]
    if not gone and not partial:
        raise HubError(f"{ref} is not among the models pulled (see `chatpage models`)")
    freed = sum(f.size_on_disk for f in partial)
    for f in partial:
        f.file_path.unlink(missing_ok=True)
    _remove(gone, repo_models)
    return gone, freed


def _remove(gone: list[PulledModel], repo_models: list[PulledModel]) -> None:
    if not gone:
        return
    if len(gone) == len(repo_models):
        repo = next(r for r in _model_repos() if r.repo_id == gone[0].ref.repo)
        hashes = (r.commit_hash for r in repo.revisions)
        scan_cache_dir(hub_cache()).delete_revisions(*hashes).execute()
        return
    kept = {f.resolve() for m in repo_models if m not in gone for f in m.files}
    for model in gone:
        for pointer in model.files:
            blob = pointer.resolve()
            pointer.unlink()
            if blob not in kept:
                blob.unlink(missing_ok=True)


def partial_downloads() -> dict[str, int]:
    """The bytes of interrupted pulls kept for the next pull to resume, by repo."""
    return {repo: sum(f.size_on_disk for f in files) for repo, files in _partial_files().items()}


def _partial_files() -> dict[str, list[CachedIncompleteFileInfo]]:
    """The ``blobs/*.incomplete`` files of model repos, by repo id."""
    try:
        info = scan_cache_dir(hub_cache())
    except CacheNotFound:
        return {}
    partial: dict[str, list[CachedIncompleteFileInfo]] = {}
    for f in info.incomplete_files:
        folder = f.file_path.parent.parent.name
        if folder.startswith("models--"):
            repo = folder.removeprefix("models--").replace("--", "/", 1)
            partial.setdefault(repo, []).append(f)
    return partial


def _model_repos() -> list[CachedRepoInfo]:
    try:
        info = scan_cache_dir(hub_cache())
    except CacheNotFound:
        return []
    return sorted((r for r in info.repos if r.repo_type == "model"), key=lambda r: r.repo_id)


def _revision_models(repo_id: str, revision: CachedRevisionInfo) -> list[PulledModel]:
    files = {f.file_path.relative_to(revision.snapshot_path).as_posix(): f for f in revision.files}
    models = []
    for gguf in gguf_models(files):
        if gguf.complete:
            paths = tuple(files[n].file_path for n in gguf.files)
            models.append(_pulled(ModelRef(repo_id, gguf.quant), paths[0], paths, revision))
    if is_hf_model(files):
        paths = tuple(files[n].file_path for n in hf_files(files))
        models.append(_pulled(ModelRef(repo_id), revision.snapshot_path, paths, revision))
    return models


def _pulled(
    ref: ModelRef, path: Path, files: tuple[Path, ...], revision: CachedRevisionInfo
) -> PulledModel:
    size = sum(f.stat().st_size for f in files)
    return PulledModel(ref, path, files, size, revision.commit_hash)
