"""Models for the GPU tests: the tiny random Llama and Qwen2 of the CPU suite, with the default
model's tokenizer where it is installed, else a tokenizer trained here (a GPU machine may have
neither the default model nor a network)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from model_dirs import offline_tokenizer_dir, tiny_model_dir  # noqa: E402

from chatpage.engine.load.loader import ModelLoadError, load_model  # noqa: E402


@pytest.fixture(scope="session")
def gpu_tokenizer_dir(tmp_path_factory) -> Path:
    try:
        return load_model(None, progress=lambda _m: None).directory
    except ModelLoadError:
        return offline_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def gpu_tiny_dir(request, tmp_path_factory, gpu_tokenizer_dir) -> Path:
    return tiny_model_dir(request.param, tmp_path_factory.mktemp("models"), gpu_tokenizer_dir)
