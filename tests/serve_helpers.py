"""A real `chatpage serve` in a subprocess on a free port, for the serve and remote tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from chatpage.remote.client import RemoteEngineClient

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(
    model_dir: Path,
    home: Path,
    api_key: str | None = None,
    port: int | None = None,
    extra: Sequence[str] = (),
    kv_cache: str = "32MiB",
) -> Iterator[str]:
    """Start ``chatpage serve`` on ``model_dir`` (with the flags ``extra``); yield its base URL
    once /health says ready."""
    cmd = [
        sys.executable,
        "-m",
        "chatpage.cli",
        "serve",
        "--model",
        str(model_dir),
        "--kv-cache",
        kv_cache,
        *extra,
    ]
    if api_key:
        cmd += ["--api-key", api_key]
    with _process(cmd, home, port or free_port(), "/health") as url:
        yield url


def metrics(url: str) -> dict[str, float]:
    """The server's /metrics, each family's first sample by the family's name."""
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    return {f.name: f.samples[0].value for f in families if f.samples}


def wait_idle(url: str, quiet_s: float = 0.5) -> None:
    """Wait until the server has pinned its personas' prompts and runs nothing, for ``quiet_s``
    on end: a request asked then is batched with nothing else. (A server prefills its persona
    prompts after /health says ready; an answer batched with them may differ in its last
    bits: a step of many rows computes its matmuls with other kernels, LlamaModel.exact_rows.)"""
    deadline, since = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        now = metrics(url)
        idle = now["chatpage:blocks_pinned"] > 0 and not (
            now["vllm:num_requests_running"] or now["vllm:num_requests_waiting"]
        )
        if not idle:
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.1)
    raise AssertionError(f"{url} never went idle with its personas pinned")


@contextmanager
def llama_server(gguf: Path, home: Path) -> Iterator[str]:
    """llama-cpp-python's OpenAI-compatible server on ``gguf`` (the `make test-peers` tests)."""
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--n_ctx", "2048"]
    with _process(cmd, home, free_port(), "/v1/models") as url:
        yield url


@contextmanager
def _process(cmd: list[str], home: Path, port: int, ready_path: str) -> Iterator[str]:
    """Run a server (``cmd`` plus ``--port``) and yield its URL once ``ready_path`` answers 200."""
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_DATA_HOME": str(home / "data"),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [*cmd, "--port", str(port)]
    log = open(home / f"server-{port}.log", "w+")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"{cmd[2]} exited {proc.returncode}:\n{log.read()}")
            try:
                if httpx.get(f"{url}{ready_path}", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[2]} did not become ready")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@contextmanager
def connected(url: str, timeout_s: float = 60.0) -> Iterator[RemoteEngineClient]:
    """A started `RemoteEngineClient` of the server at ``url``, ready (or the test fails)."""
    client = RemoteEngineClient(url, timeout_s=timeout_s)
    client.start()
    try:
        assert client.wait_ready(30), client.status
        yield client
    finally:
        client.close()
