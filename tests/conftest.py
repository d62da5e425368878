"""Shared fixtures: tiny random Llama/Qwen2 models (fast) and the real default model (a few cases).

Tiny models use the default model's tokenizer (so chat templates and text are real) with random
weights; they are written once per session as HF directories, exactly what `--model PATH` reads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from helpers import alpha_and_beta, hf_model_dir
from model_dirs import tiny_model_dir

from chatpage.config.paths import cache_dir
from chatpage.engine.load.loader import default_model_path, gguf_cache_dir, packed_weights_path


@pytest.fixture(scope="session", autouse=True)
def _no_packed_leftovers(tmp_path_factory):
    """Weights the tests pack for their temporary models are cached like a user's (under the
    cache's models/, keyed by the model's path): at the end, remove the packs (and a GGUF's
    tokenizer) of the models this session wrote (other sessions' and the user's stay)."""
    tokenizers = cache_dir() / "tokenizers"  # a GGUF's tokenizer, cached by its vocabulary
    before = set(tokenizers.iterdir()) if tokenizers.is_dir() else set()
    yield
    for made in set(tokenizers.iterdir()) - before if tokenizers.is_dir() else ():
        shutil.rmtree(made, ignore_errors=True)
    for gguf in tmp_path_factory.getbasetemp().rglob("*.gguf"):  # the tests' own GGUF files
        shutil.rmtree(gguf_cache_dir(gguf), ignore_errors=True)
    for config in tmp_path_factory.getbasetemp().rglob("config.json"):
        packs = packed_weights_path(config.parent, "int4").parent.parent
        if packs.parent == cache_dir() / "models" and packs.is_dir():
            shutil.rmtree(packs, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _session_kv_dir(tmp_path_factory):
    """The KV disk tier of what starts before a test's own dirs are set (a module's `chatpage
    serve`, say): the session's, never the user's (each test then gets its own, below)."""
    previous = os.environ.get("CHATPAGE_KV_DIR")
    os.environ["CHATPAGE_KV_DIR"] = str(tmp_path_factory.mktemp("kv"))
    yield
    if previous is None:
        os.environ.pop("CHATPAGE_KV_DIR", None)
    else:
        os.environ["CHATPAGE_KV_DIR"] = previous


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The default model as an fp32 HF directory (written from the GGUF into the cache's
    test-models/ on first use): what transformers runs as the reference."""
    return hf_model_dir(default_model_path(), cache_dir() / "test-models")


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, default_model_dir) -> Path:
    return tiny_model_dir("llama", tmp_path_factory.mktemp("models"), default_model_dir)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, default_model_dir) -> Path:
    return tiny_model_dir("qwen2", tmp_path_factory.mktemp("models"), default_model_dir)


@pytest.fixture
def personas_dir(tmp_path) -> Path:
    """A personas folder with the "alpha" and "beta" test personas (the apps over the tiny
    model start on alpha)."""
    return alpha_and_beta(tmp_path)


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    """Every test gets its own data and config dirs and KV disk tier; the cache (models,
    kernels) is shared."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("CHATPAGE_KV_DIR", str(tmp_path / "kv"))  # (the disk tier's blocks)
