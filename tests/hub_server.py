"""A Hugging Face Hub on localhost for the pull tests: a real HTTP server that answers the
endpoints huggingface_hub calls, with the headers it reads (file_download.py, hf_api.py,
utils/_http.py), for repos of real files held in memory.

- ``GET /api/models/OWNER/NAME[/revision/REV]`` (``?blobs=true``): the repo's commit and its
  files with size, git blob id and, for a large file, the LFS sha256;
- ``HEAD|GET /OWNER/NAME/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag`` (the git blob id, or
  ``X-Linked-Etag`` = the sha256 and ``X-Linked-Size`` for an LFS file), ``Content-Length``,
  ranges (``206`` with ``Content-Range``);
- 404s with the Hub's ``X-Error-Code`` (``RepoNotFound``, ``EntryNotFound``).

Faults, set per file: ``cut[path] = n`` sends the headers of the whole file, then ``n`` bytes,
then closes the connection (once; with ``down_after_cut`` the server then stops, as a network
that went away); ``corrupt.add(path)`` serves the bytes with one flipped;
``pace[path] = s`` sleeps ``s`` seconds after every ``CHUNK`` bytes (a slow network).
``requests`` records ``(method, path, Range header)`` of every request.

`serve_hub` starts one and points huggingface_hub at it, as ``HF_ENDPOINT`` and
``HF_HUB_CACHE`` do when it is imported, with its download chunk (10 MB) made ``CHUNK``: these
small files then come in many chunks, as a model does.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".onnx")
CHUNK = 4096


def serve_hub(monkeypatch, cache: Path) -> Hub:
    """A started `Hub` that huggingface_hub uses, its cache at ``cache`` (stop it at the end)."""
    from huggingface_hub import constants

    hub = Hub().start()
    template = hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", CHUNK)
    return hub


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        entry: dict = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if name.endswith(LFS_SUFFIXES):
            entry["lfs"] = {
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "pointerSize": 134,
            }
        return entry


@dataclass
class Hub:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut: dict[str, int] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    pace: dict[str, float] = field(default_factory=dict)
    down_after_cut: bool = False
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    url: str = ""
    server: ThreadingHTTPServer | None = None

    def start(self) -> Hub:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

            def do_GET(self) -> None:
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    # -- the endpoints ------------------------------------------------------------------------
    def answer(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append((h.command, path, h.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            self.info(h, "/".join(parts[2:4]))
        elif len(parts) >= 5 and parts[2] == "resolve":
            self.resolve(h, "/".join(parts[:2]), "/".join(parts[4:]), body)
        else:
            self.error(h, 404, "RepoNotFound", "Repository not found")

    def info(self, h: BaseHTTPRequestHandler, repo_id: str) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self.error(h, 404, "RepoNotFound", "Repository not found")
            return
        data = json.dumps(
            {"id": repo_id, "sha": repo.commit, "siblings": [repo.sibling(n) for n in repo.files]}
        ).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def resolve(self, h: BaseHTTPRequestHandler, repo_id: str, name: str, body: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self.error(h, 404, "RepoNotFound", "Repository not found")
            return
        if name not in repo.files:
            self.error(h, 404, "EntryNotFound", "Entry not found", repo.commit)
            return
        data = repo.files[name]
        sibling = repo.sibling(name)
        if name in self.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        if (wanted := h.headers.get("Range")) and body:
            start = int(wanted.removeprefix("bytes=").split("-")[0])
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{sibling["blobId"]}"')
        if "lfs" in sibling:
            h.send_header("X-Linked-Etag", f'"{sibling["lfs"]["sha256"]}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if not body:
            return
        cut = self.cut.pop(name, None)
        body_bytes = data[start : cut if cut is not None else None]
        step = CHUNK if name in self.pace else max(len(body_bytes), 1)
        try:
            for at in range(0, len(body_bytes), step):
                h.wfile.write(body_bytes[at : at + step])
                time.sleep(self.pace.get(name, 0.0))
        except (BrokenPipeError, ConnectionResetError):  # the client stopped (a cancel)
            return
        if cut is not None:
            h.wfile.flush()
            h.close_connection = True
            h.connection.close()
            if self.down_after_cut:
                threading.Timer(0.3, self.stop).start()  # once the client has read the cut

    def error(
        self, h: BaseHTTPRequestHandler, status: int, code: str, message: str, commit: str = ""
    ) -> None:
        data = json.dumps({"error": message}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
