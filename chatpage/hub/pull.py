"""`chatpage pull REPO[:QUANT]`: the files of one model from the Hub into huggingface_hub's cache.

`plan_pull` asks the Hub (``model_info`` with the files' sizes and hashes) which files to fetch,
what is cached already and how much disk is free; `run_pull` fetches them. A file is written to
``blobs/<hash>.incomplete`` by huggingface_hub's own downloader (``http_get``: ranged requests
that resume a dropped connection), kept there when the pull stops (a cut, a full disk, a
cancel, ctrl+c) so that the next pull resumes it, checked against the hash the Hub gives (the
LFS sha256, or the git blob id of a small file: huggingface_hub checks only the length) and
only then moved to ``blobs/<hash>``; ``hf_hub_download`` then links it into the snapshot and
records the branch, exactly as for any file it fetched itself. A file that fails its hash is
deleted, so nothing wrong is ever left where a model is looked for.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_download, hf_hub_url
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils._headers import build_hf_headers  # public, lazily re-exported by utils

from chatpage.config.settings import format_size
from chatpage.hub.refs import (
    HubError,
    ModelRef,
    PullCancelled,
    choose_files,
    parse_ref,
    quant_of,
)

HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repo as the Hub lists it: its size and hash (the LFS sha256 of a large file,
    else its git blob id), which also names its blob in the cache."""

    name: str
    size: int
    sha256: str | None
    blob_id: str

    @property
    def blob(self) -> str:
        return self.sha256 or self.blob_id


@dataclass(frozen=True)
class Plan:
    """What a pull will do, known before it starts (shown first by `chatpage pull`)."""

    ref: ModelRef
    commit: str
    files: tuple[RemoteFile, ...]
    cached: frozenset[str]
    """The files already in the cache (nothing to fetch)."""
    partial: int
    """Bytes already downloaded by a pull that stopped (resumed, not fetched again)."""
    free: int
    """Free bytes on the cache's disk."""
    storage: Path
    """The repo's folder in huggingface_hub's cache."""

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def to_fetch(self) -> int:
        return sum(f.size for f in self.files if f.name not in self.cached) - self.partial


@dataclass(frozen=True)
class Progress:
    """How far a pull is: the file being fetched, and the bytes of the whole pull."""

    file: str
    done: int
    total: int


def hub_cache() -> Path:
    """huggingface_hub's cache (``HF_HUB_CACHE``, else ``HF_HOME``/hub), as it reads it."""
    return Path(constants.HF_HUB_CACHE)


def plan_pull(text: str) -> Plan:
    """Ask the Hub which files ``text`` (``REPO[:QUANT]``) means and what the cache has of them."""
    ref = parse_ref(text)
    if ref is None:
        raise HubError(f"{text!r} is not a Hugging Face model: use OWNER/NAME[:QUANT]")
    if constants.is_offline_mode():
        raise HubError("HF_HUB_OFFLINE is set: pulling a model needs the network")
    with hub_errors(ref):
        info = HfApi().model_info(ref.repo, files_metadata=True)
    listed = {s.rfilename: s for s in info.siblings or []}
    files = tuple(
        RemoteFile(
            name,
            listed[name].size or 0,
            lfs.sha256 if (lfs := listed[name].lfs) else None,
            listed[name].blob_id or "",
        )
        for name in choose_files(ref, listed)
    )
    storage = hub_cache() / repo_folder_name(repo_id=info.id, repo_type="model")
    snapshot = storage / "snapshots" / (info.sha or "")
    cached = frozenset(f.name for f in files if (snapshot / f.name).is_file())
    partial = sum(
        _size(storage / "blobs" / f"{f.blob}.incomplete") for f in files if f.name not in cached
    )
    picked = files[0].name
    return Plan(
        ModelRef(info.id, quant_of(picked) if picked.endswith(".gguf") else None),
        info.sha or "",
        files,
        cached,
        partial,
        _free_bytes(storage),
        storage,
    )


def run_pull(
    plan: Plan,
    progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
) -> Path:
    """Fetch what `plan` lacks; the model's path (its .gguf file, a split model's first part,
    or the snapshot folder of a safetensors model). ``progress`` hears of every chunk;
    ``cancel``, once set, stops the pull at the next chunk (`PullCancelled`)."""
    if plan.to_fetch > plan.free:
        raise HubError(
            f"{plan.ref} needs {format_size(plan.to_fetch)} but only {format_size(plan.free)} is "
            f"free at {plan.storage.parent}; free some space or set HF_HUB_CACHE"
        )
    done = sum(f.size for f in plan.files if f.name in plan.cached)
    paths: list[Path] = []
    for f in plan.files:
        if f.name not in plan.cached:
            _fetch_blob(plan, f, _meter(f.name, done, plan.size, progress, cancel))
        with hub_errors(plan.ref):
            paths.append(Path(hf_hub_download(plan.ref.repo, f.name)))  # links it, notes main
        done += f.size
    if progress is not None:
        progress(Progress("", done, plan.size))
    first = paths[0]
    return first if first.name.endswith(".gguf") else first.parent


def _fetch_blob(plan: Plan, f: RemoteFile, meter: Any) -> None:
    """``f`` into ``blobs/<hash>`` through ``blobs/<hash>.incomplete`` (resumed where it stopped);
    ``meter``: `_meter`'s class."""
    blob = plan.storage / "blobs" / f.blob
    if blob.is_file():
        return  # another revision's file, or another pull's, has the same bytes
    partial = blob.with_name(f"{f.blob}.incomplete")
    partial.parent.mkdir(parents=True, exist_ok=True)
    if _size(partial) > f.size:
        partial.unlink()
    resume = _size(partial)
    url = hf_hub_url(plan.ref.repo, f.name, revision=plan.commit)
    try:
        with hub_errors(plan.ref), partial.open("ab", buffering=0) as out:  # on disk at once
            try:
                http_get(
                    url,
                    out,
                    resume_size=resume,
                    headers=build_hf_headers(),
                    expected_size=f.size,
                    displayed_filename=f.name,
                    tqdm_class=meter,
                )
            except httpx2.TransportError as e:  # http_get's own retries gave up
                raise HubError(
                    f"the connection to {constants.ENDPOINT} failed ({_reason(e)}): {f.name} "
                    f"stopped at {_stopped(partial, f)}; pull again to resume"
                ) from None
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise HubError(
                f"the disk is full ({plan.storage.parent}): {f.name} stopped at "
                f"{_stopped(partial, f)}; free some space and pull again to resume"
            ) from None
        if _size(partial) > f.size:
            partial.unlink()
        raise HubError(
            f"{f.name} stopped at {_stopped(partial, f)} ({_reason(e)}); pull again to resume"
        ) from None
    finally:
        if f.size and partial.is_file() and _size(partial) == 0:
            partial.unlink()  # nothing came: no interrupted pull to list or resume
    if _digest(partial, f) != f.blob:
        partial.unlink()
        raise HubError(
            f"{f.name} does not match the hash the Hub gives ({f.blob[:12]}…): the download is "
            "corrupt and was deleted; pull again"
        )
    os.replace(partial, blob)


def _meter(
    name: str,
    before: int,
    total: int,
    progress: Callable[[Progress], None] | None,
    cancel: threading.Event | None,
) -> Any:
    """The progress-bar class ``http_get`` is given: it draws nothing and reports each chunk
    (``before``: the pull's bytes done before this file); it is where a cancel stops a pull."""

    class Meter:
        def __init__(self, initial: int = 0, **_: object) -> None:
            self.done = before + initial

        def __enter__(self) -> Meter:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def update(self, n: int) -> None:
            if cancel is not None and cancel.is_set():
                raise PullCancelled(f"pull cancelled; pull {name} again to resume")
            self.done += n
            if progress is not None:
                progress(Progress(name, self.done, total))

    return Meter


def _digest(path: Path, f: RemoteFile) -> str:
    """``path``'s hash in the form the Hub gives for ``f``: sha256, or the git blob id (sha1
    of ``blob <size>\\0`` and the bytes)."""
    h = hashlib.sha256() if f.sha256 else hashlib.sha1(f"blob {_size(path)}\0".encode())
    with path.open("rb") as src:
        while chunk := src.read(HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


@contextmanager
def hub_errors(ref: ModelRef) -> Iterator[None]:
    """huggingface_hub's and the network's errors as one line each (`HubError`); its own
    retry warnings stay unsaid meanwhile (written to stderr, they would stand above the one line in
    a terminal and over the TUI's screen)."""
    endpoint = constants.ENDPOINT
    hub_log = logging.getLogger("huggingface_hub")
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        yield
    except GatedRepoError:
        raise HubError(
            f"{ref.repo} is gated: accept its terms on {endpoint}/{ref.repo} and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{ref.repo}: no such model on {endpoint} (a private one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"{ref.repo}: its main branch is missing on {endpoint}") from None
    except OfflineModeIsEnabled:
        raise HubError("HF_HUB_OFFLINE is set: pulling a model needs the network") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        raise HubError(f"{endpoint} answered {status} for {ref.repo}; try again later") from None
    except httpx2.TransportError as e:
        raise HubError(f"cannot reach {endpoint}: {_reason(e)}") from None
    finally:
        hub_log.setLevel(level)


def _reason(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _stopped(partial: Path, f: RemoteFile) -> str:
    return f"{format_size(_size(partial))} of {format_size(f.size)}"


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _free_bytes(path: Path) -> int:
    """Free bytes on the disk ``path`` will be on (its nearest folder that exists)."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            return shutil.disk_usage(folder).free
    return 0
