"""The engine folder's shared reference: transformers' run of the tiny random Llama, loaded once
a module (the engines under test differ in their KV cache: each module builds its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
from model_dirs import reference_model


@pytest.fixture(scope="module")
def tiny_hf(tiny_llama_dir: Path):
    """transformers' tiny Llama (fp32, eval): the reference the engine's outputs are checked
    against."""
    return reference_model(tiny_llama_dir)
