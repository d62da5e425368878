"""The engine folder's shared reference: transformers' run of the tiny random Llama, loaded once
a module (the engines under test differ in their KV cache: each module builds its own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from model_dirs import reference_model


@pytest.fixture(scope="module")
def tiny_hf(tiny_llama_dir: Path):
    """transformers' tiny Llama (fp32, eval): the reference the engine's outputs are checked
    against."""
    return reference_model(tiny_llama_dir)


WINDOW = 20  # the hybrid model's sliding window


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory, default_model_dir):
    """A tiny random hybrid Qwen2 (layer 0 full attention, layer 1 a sliding window of
    ``WINDOW``) and transformers' model of it."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=49152,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=False,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,  # layer 0 full attention, layer 1 sliding
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.2)
    out = tmp_path_factory.mktemp("models") / "hybrid"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(out)
    return out, model.eval()
