"""Shared fixtures: tiny random Llama/Qwen2 models (fast) and the real default model (a few cases).

Tiny models use the default model's tokenizer (so chat templates and text are real) with random
weights; they are written once per session as HF directories, exactly what `--model PATH` reads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from chatpage.engine.loader import load_model


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The dequantized default model (built into the XDG cache on first use)."""
    return load_model(None, progress=lambda _m: None).directory


def _tiny(kind: str, root: Path, tokenizer_dir: Path, **overrides) -> Path:
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    common = dict(
        vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, rms_norm_eps=1e-5,
    )
    common.update(overrides)
    if kind == "llama":
        config = LlamaConfig(tie_word_embeddings=False, **common)
        model = LlamaForCausalLM(config)
    else:
        config = Qwen2Config(tie_word_embeddings=False, use_sliding_window=False, **common)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # random, non-zero qkv biases so the bias path is exercised
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    # Untied, with a wider lm_head than the default init: logits spread enough that greedy choices
    # are not near-ties, yet no token is certain (a tied random model just repeats its input,
    # which makes beam search degenerate). The default model covers tied embeddings.
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.2)
    out = root / kind
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, default_model_dir) -> Path:
    return _tiny("llama", tmp_path_factory.mktemp("models"), default_model_dir)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, default_model_dir) -> Path:
    return _tiny("qwen2", tmp_path_factory.mktemp("models"), default_model_dir)


@pytest.fixture(autouse=True)
def _private_dirs(tmp_path, monkeypatch):
    """Every test gets its own data and config dirs; the cache (models, kernels) is shared."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
