"""`chatpage pull`, `chatpage models` and ``--model REPO[:QUANT]``: the real huggingface_hub client
against a Hub on localhost (tests/hub_server.py) serving repos of real model files."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pty
import shutil
import subprocess
import sys
import threading
from collections import namedtuple
from pathlib import Path

import pytest
from gguf_files import Q, write_gguf
from hub_server import CHUNK, Hub, Repo, serve_hub
from huggingface_hub import constants

from chatpage.cli.main import main
from chatpage.engine.load.loader import load_model
from chatpage.hub.cache import find_pulled, partial_downloads, pulled_models, remove_pulled
from chatpage.hub.pull import plan_pull, run_pull
from chatpage.hub.refs import HubError, PullCancelled, parse_ref, quant_of


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, bytes]:
    """Real GGUF files of a tiny qwen2 model, by quant."""
    root = tmp_path_factory.mktemp("ggufs")
    return {
        name: write_gguf(root / f"{name}.gguf", qtype, seed=i).read_bytes()
        for i, (name, qtype) in enumerate((("Q4_K_M", Q.Q4_K), ("Q8_0", Q.Q8_0), ("F16", Q.F16)))
    }


@pytest.fixture
def hub(tmp_path, monkeypatch, ggufs, tiny_llama_dir):
    """The Hub on localhost serving the test repos; huggingface_hub's cache in ``tmp_path``."""
    hub = serve_hub(monkeypatch, tmp_path / "hf-cache")
    half = len(ggufs["Q4_K_M"]) // 2
    hf_files = {p.name: p.read_bytes() for p in tiny_llama_dir.iterdir() if p.is_file()}
    hub.repos = {
        "test/tiny-GGUF": Repo(
            {
                "tiny-Q4_K_M.gguf": ggufs["Q4_K_M"],
                "tiny-q8_0.gguf": ggufs["Q8_0"],
                "tiny-F16.gguf": ggufs["F16"],
                "mmproj-tiny-F16.gguf": ggufs["F16"][:1000],
                "README.md": b"# tiny\n",
            }
        ),
        "test/q8-GGUF": Repo({"tiny.Q8_0.gguf": ggufs["Q8_0"], "tiny.f16.gguf": ggufs["F16"]}),
        "test/plain-GGUF": Repo({"b.gguf": ggufs["F16"], "a.gguf": ggufs["Q8_0"]}),
        "test/split-GGUF": Repo(
            {
                "Q4_K_M/tiny-Q4_K_M-00001-of-00002.gguf": ggufs["Q4_K_M"][:half],
                "Q4_K_M/tiny-Q4_K_M-00002-of-00002.gguf": ggufs["Q4_K_M"][half:],
                "tiny-Q8_0.gguf": ggufs["Q8_0"],
            }
        ),
        "test/tiny-hf": Repo(
            {
                **hf_files,
                "pytorch_model.bin": b"\0" * 64,
                "onnx/model.onnx": b"\0" * 64,
                "README.md": b"# tiny\n",
            }
        ),
    }
    yield hub
    hub.stop()


def fetched(hub: Hub) -> list[str]:
    """The files downloaded (GET of a resolve URL, at any revision), in order."""
    return [
        path.split("/resolve/", 1)[1].split("/", 1)[1]
        for method, path, _ in hub.requests
        if method == "GET" and "/resolve/" in path
    ]


def model_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- which files --------------------------------------------------------------------------------
def test_refs_and_quants():
    assert parse_ref("hf.co/bartowski/X-GGUF:q4_k_m").repo == "bartowski/X-GGUF"
    assert parse_ref("https://huggingface.co/a/b").quant is None
    assert parse_ref("./models/x.gguf") is None and parse_ref("a/b/c") is None
    assert parse_ref("/abs/path") is None and parse_ref("a/../b") is None
    names = {
        "SmolLM2-135M-Instruct-Q4_K_M.gguf": "Q4_K_M",
        "qwen2.5-0.5b-instruct-q8_0.gguf": "Q8_0",
        "Model-UD-IQ2_XXS.gguf": "IQ2_XXS",
        "gemma-3-270m-it-F16.gguf": "F16",
        "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf": "Q4_K_M",
        "model.gguf": None,
    }
    assert {n: quant_of(n) for n in names} == names


def test_the_quant_picked(hub, tiny_llama_dir):
    def picked(ref: str) -> list[str]:
        return [f.name for f in plan_pull(ref).files]

    assert picked("test/tiny-GGUF") == ["tiny-Q4_K_M.gguf"]  # the default, Q4_K_M
    assert picked("test/tiny-GGUF:q8_0") == ["tiny-q8_0.gguf"]  # case does not matter
    assert picked("hf.co/test/tiny-GGUF:F16") == ["tiny-F16.gguf"]  # never the projector
    assert picked("test/q8-GGUF") == ["tiny.Q8_0.gguf"]  # no Q4_K_M: Q8_0
    assert picked("test/plain-GGUF") == ["a.gguf"]  # no quant named: the first
    assert picked("test/split-GGUF") == [
        "Q4_K_M/tiny-Q4_K_M-00001-of-00002.gguf",
        "Q4_K_M/tiny-Q4_K_M-00002-of-00002.gguf",
    ]
    assert picked("test/tiny-hf") == model_files(tiny_llama_dir)  # no .bin, ONNX or README
    with pytest.raises(
        HubError,
        match=r"^test/tiny-GGUF has no Q5_K_S file; its quants: F16, "
        r"Q4_K_M, Q8_0$",
    ):
        plan_pull("test/tiny-GGUF:Q5_K_S")
    with pytest.raises(HubError, match="test/tiny-hf has no .gguf files"):
        plan_pull("test/tiny-hf:Q4_K_M")
    assert fetched(hub) == []  # planning reads the repo's listing only


# -- pulling ------------------------------------------------------------------------------------
def test_pull_a_gguf_then_run_it_by_name(hub, ggufs):
    plan = plan_pull("test/tiny-GGUF")
    assert plan.cached == frozenset() and plan.partial == 0
    assert plan.size == plan.to_fetch == len(ggufs["Q4_K_M"]) and plan.free > plan.size
    seen = []
    path = run_pull(plan, seen.append)
    assert path.read_bytes() == ggufs["Q4_K_M"]
    assert path.is_relative_to(constants.HF_HUB_CACHE) and path.name == "tiny-Q4_K_M.gguf"
    assert [p.done for p in seen] == sorted(p.done for p in seen)
    assert seen[-1].done == seen[-1].total == plan.size
    assert fetched(hub) == ["tiny-Q4_K_M.gguf"]  # once: huggingface_hub links what we fetched
    (model,) = pulled_models()
    assert str(model.ref) == "test/tiny-GGUF:Q4_K_M" and model.size == plan.size
    assert find_pulled("test/tiny-GGUF") == find_pulled("test/tiny-gguf:q4_k_m") == model
    assert find_pulled("test/tiny-GGUF:Q8_0") is None
    again = plan_pull("test/tiny-GGUF")
    assert again.to_fetch == 0 and run_pull(again) == path and len(fetched(hub)) == 1
    loaded = load_model("test/tiny-GGUF:Q4_K_M", progress=lambda _: None)
    assert loaded.name == "test/tiny-GGUF:Q4_K_M" and loaded.gguf == path


@pytest.mark.slow  # pulls through a real Hub server
def test_pull_a_safetensors_model_then_ask_it(hub, tiny_llama_dir, monkeypatch, capsys):
    path = run_pull(plan_pull("test/tiny-hf"))
    assert path.is_dir() and model_files(path) == model_files(tiny_llama_dir)
    assert (path / "model.safetensors").read_bytes() == (
        tiny_llama_dir / "model.safetensors"
    ).read_bytes()
    assert not any(n.endswith((".bin", ".onnx", ".md")) for n in fetched(hub))
    (model,) = pulled_models()
    assert str(model.ref) == "test/tiny-hf" and model.path == path
    loaded = load_model("test/tiny-hf", progress=lambda _: None)
    assert loaded.name == "test/tiny-hf" and loaded.directory == path
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)  # nothing piped in
    assert main(["--model", "test/tiny-hf", "ask", "hello?", "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out.strip()  # an answer, from the model pulled


def test_a_split_gguf_is_fetched_whole(hub, ggufs):
    path = run_pull(plan_pull("test/split-GGUF"))
    assert path.name == "tiny-Q4_K_M-00001-of-00002.gguf"
    parts = sorted(path.parent.iterdir())
    assert b"".join(p.read_bytes() for p in parts) == ggufs["Q4_K_M"]
    assert "tiny-Q8_0.gguf" not in fetched(hub)
    (model,) = pulled_models()
    assert model.path == path and len(model.files) == 2


@pytest.mark.slow  # pulls through a real Hub server
def test_a_dropped_connection_resumes(hub, ggufs):
    hub.cut["tiny-q8_0.gguf"] = 2 * CHUNK  # the first answer stops two chunks in
    path = run_pull(plan_pull("test/tiny-GGUF:Q8_0"))
    assert path.read_bytes() == ggufs["Q8_0"]
    gets = [(p, r) for m, p, r in hub.requests if m == "GET" and p.endswith("q8_0.gguf")]
    assert [r for _, r in gets] == [None, f"bytes={2 * CHUNK}-"]


@pytest.mark.slow  # pulls through a real Hub server
def test_an_interrupted_pull_resumes_where_it_stopped(hub, ggufs, capsys):
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(PullCancelled):  # cancelled before a byte came: nothing is kept
        run_pull(plan_pull("test/tiny-GGUF:Q8_0"), cancel=cancelled)
    assert partial_downloads() == {}
    hub.requests.clear()
    hub.cut["tiny-q8_0.gguf"] = 2 * CHUNK
    cancel = threading.Event()
    chunks = []

    def progress(p) -> None:
        chunks.append(p)
        if len(chunks) == 2:  # two chunks written; the connection cut; the resumed one refused
            cancel.set()

    with pytest.raises(PullCancelled, match="pull cancelled; pull tiny-q8_0.gguf again"):
        run_pull(plan_pull("test/tiny-GGUF:Q8_0"), progress, cancel)
    assert pulled_models() == [] and find_pulled("test/tiny-GGUF:Q8_0") is None
    assert partial_downloads() == {"test/tiny-GGUF": 8192}
    assert main(["models"]) == 0
    assert "8 KiB of interrupted pulls kept (test/tiny-GGUF): pull again" in capsys.readouterr().out
    plan = plan_pull("test/tiny-GGUF:Q8_0")
    assert plan.partial == 8192 and plan.to_fetch == len(ggufs["Q8_0"]) - 8192
    path = run_pull(plan)
    assert path.read_bytes() == ggufs["Q8_0"]
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.endswith("q8_0.gguf")]
    assert ranges == [None, "bytes=8192-", "bytes=8192-"]  # cut, resumed and cancelled; resumed
    assert partial_downloads() == {}


@pytest.mark.slow  # pulls through a real Hub server
def test_a_network_gone_mid_pull_keeps_what_was_fetched(hub, capsys):
    hub.cut["tiny-q8_0.gguf"] = 2 * CHUNK
    hub.down_after_cut = True  # huggingface_hub tries 5 times, a second apart, then gives up
    said: list[logging.LogRecord] = []
    hub_log = logging.getLogger("huggingface_hub")
    listener = logging.Handler()
    listener.emit = said.append  # type: ignore[method-assign]
    hub_log.addHandler(listener)
    with pytest.raises(
        HubError,
        match=rf"^the connection to {hub.url} failed \(.*\): tiny-q8_0.gguf stopped at 8 KiB of "
        r"759.7 KiB; pull again to resume$",
    ):
        run_pull(plan_pull("test/tiny-GGUF:Q8_0"))
    hub_log.removeHandler(listener)
    assert said == []  # its retries unsaid: the one line above is all a user sees
    assert pulled_models() == [] and partial_downloads() == {"test/tiny-GGUF": 2 * CHUNK}
    assert main(["models", "rm", "test/tiny-gguf"]) == 0  # what was kept can be dropped
    assert capsys.readouterr().out == "removed 8 KiB of interrupted pulls\n"
    assert partial_downloads() == {}


def test_a_full_disk_keeps_what_was_fetched(hub):
    plan = plan_pull("test/tiny-GGUF")
    (f,) = plan.files
    partial = plan.storage / "blobs" / f"{f.blob}.incomplete"
    partial.parent.mkdir(parents=True)
    partial.symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(
        HubError,
        match=r"^the disk is full \(.*hf-cache\): tiny-Q4_K_M.gguf stopped at 0 B of 406.9 KiB; "
        r"free some space and pull again to resume$",
    ):
        run_pull(plan)
    assert pulled_models() == []
    partial.unlink()
    assert run_pull(plan_pull("test/tiny-GGUF")).is_file()


def test_the_progress_bar_on_a_terminal(hub, monkeypatch):
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main(["pull", "test/tiny-GGUF"]) == 0
    drawn = b""
    os.set_blocking(master, False)
    with contextlib.suppress(OSError):
        while chunk := os.read(master, 1 << 16):
            drawn += chunk
    os.close(master)
    *_, last = drawn.decode().rstrip("\r\n").split("\r")
    assert last.startswith(f"[{'#' * 30}] 100% 406.9 KiB of 406.9 KiB ")


def test_a_corrupt_download_is_deleted(hub):
    hub.corrupt.add("tiny-Q4_K_M.gguf")
    with pytest.raises(HubError, match=r"^tiny-Q4_K_M.gguf does not match the hash the Hub gives"):
        run_pull(plan_pull("test/tiny-GGUF"))
    assert pulled_models() == [] and partial_downloads() == {}
    storage = Path(constants.HF_HUB_CACHE) / "models--test--tiny-GGUF"
    assert [p for p in storage.rglob("*") if p.is_file()] == []
    hub.corrupt.clear()
    assert run_pull(plan_pull("test/tiny-GGUF")).is_file()  # the next pull starts afresh


def test_what_cannot_be_pulled_says_why_in_one_line(hub, monkeypatch):
    with pytest.raises(HubError, match=rf"^test/nope: no such model on {hub.url} "):
        plan_pull("test/nope")
    with pytest.raises(HubError, match="is not a Hugging Face model: use OWNER/NAME"):
        plan_pull("not a repo")
    usage = namedtuple("usage", "total used free")
    with monkeypatch.context() as full:
        full.setattr(shutil, "disk_usage", lambda _: usage(10**6, 10**6 - 1000, 1000))
        with pytest.raises(
            HubError, match=r"^test/tiny-GGUF:Q4_K_M needs .* but only 1000 B is free at"
        ):
            run_pull(plan_pull("test/tiny-GGUF"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        HubError, match="^HF_HUB_OFFLINE is set: pulling a model needs the network$"
    ):
        plan_pull("test/tiny-GGUF")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.stop()
    with pytest.raises(HubError, match=rf"^cannot reach {hub.url}: "):
        plan_pull("test/tiny-GGUF")
    assert not Path(constants.HF_HUB_CACHE, "models--test--tiny-GGUF").exists()


# -- the commands -------------------------------------------------------------------------------
def test_pull_models_and_rm_commands(hub, capsys):
    assert main(["models"]) == 0
    assert "no models pulled" in capsys.readouterr().out
    assert main(["pull", "test/tiny-GGUF"]) == 0
    assert main(["pull", "test/tiny-GGUF:Q8_0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("test/tiny-GGUF:Q4_K_M (1 file, ") and " to fetch; " in out[0]
    assert out[-1] == "run it: chatpage --model test/tiny-GGUF:Q8_0"
    assert "run it: chatpage --model test/tiny-GGUF:Q4_K_M" in out
    assert main(["models"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["MODEL", "SIZE", "PATH"]
    assert [row.split()[0] for row in table[1:]] == ["test/tiny-GGUF:Q4_K_M", "test/tiny-GGUF:Q8_0"]
    assert main(["models", "rm", "test/tiny-GGUF:q8_0"]) == 0
    assert capsys.readouterr().out.startswith("removed test/tiny-GGUF:Q8_0 (")
    (left,) = pulled_models()
    assert str(left.ref) == "test/tiny-GGUF:Q4_K_M" and left.path.is_file()
    assert main(["models", "rm", "test/tiny-GGUF"]) == 0
    assert pulled_models() == []
    assert not Path(constants.HF_HUB_CACHE, "models--test--tiny-GGUF").exists()
    assert main(["models", "rm", "test/tiny-GGUF"]) == 1
    assert main(["pull", "test/tiny-GGUF:Q2_K"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "chatpage: error: test/tiny-GGUF is not among the models pulled (see `chatpage models`)",
        "chatpage: error: test/tiny-GGUF has no Q2_K file; its quants: F16, Q4_K_M, Q8_0",
    ]


@pytest.mark.slow  # two chatpage processes of its own
def test_the_command_reads_hf_endpoint_and_hf_hub_cache(hub, tmp_path):
    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "0",
    }
    run = subprocess.run(
        [sys.executable, "-m", "chatpage.cli", "pull", "test/q8-GGUF"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "run it: chatpage --model test/q8-GGUF:Q8_0"
    assert (tmp_path / "cache" / "models--test--q8-GGUF").is_dir()
    offline = subprocess.run(
        [sys.executable, "-m", "chatpage.cli", "pull", "test/q8-GGUF"],
        env={**env, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert offline.returncode == 1
    assert offline.stderr == (
        "chatpage: error: HF_HUB_OFFLINE is set: pulling a model needs the network\n"
    )


def test_remove_a_model_not_pulled(hub):
    with pytest.raises(HubError, match="is not among the models pulled"):
        remove_pulled("test/tiny-GGUF")
