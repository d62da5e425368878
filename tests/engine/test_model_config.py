"""Reading a model's config without transformers' model modules, where that is safe.

The fast config must agree with transformers' own config on every field the engine reads; a config
that needs interpreting (scaled RoPE, missing fields, a sliding window) still goes through
AutoConfig, and the engine still matches transformers on it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from model_dirs import reference_model, tiny_model_dir

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.load.loader import _read_config
from chatpage.engine.model.arch import rope_inv_freq
from chatpage.engine.model.model_config import ModelConfig

# (layer_types: None on the fast path, which has no window; transformers derives a list of full
# layers; a GGUF's window gives it one)
FIELDS = [n for n in ModelConfig.__dataclass_fields__ if n not in ("head_dim", "layer_types")]


def _auto(directory):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(directory)


@pytest.mark.parametrize("which", ["tiny_llama_dir", "tiny_qwen2_dir", "default_model_dir"])
def test_the_fast_config_agrees_with_transformers(which, request):
    directory = request.getfixturevalue(which)
    ours, theirs = _read_config(directory), _auto(directory)
    assert isinstance(ours, ModelConfig)
    for name in FIELDS:
        assert getattr(ours, name) == getattr(theirs, name, None), name
    head_dim = getattr(theirs, "head_dim", None) or theirs.hidden_size // theirs.num_attention_heads
    assert (ours.head_dim or ours.hidden_size // ours.num_attention_heads) == head_dim
    inv_ours, scale_ours = rope_inv_freq(ours)
    inv_theirs, scale_theirs = rope_inv_freq(theirs)
    assert torch.equal(inv_ours, inv_theirs) and scale_ours == scale_theirs


def _edited(src, dst, **changes):
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


def test_the_older_rope_spelling_is_read_fast(tiny_llama_dir, tmp_path):
    theta = _read_config(tiny_llama_dir).rope_parameters["rope_theta"]
    d = _edited(
        tiny_llama_dir, tmp_path / "m", rope_parameters=None, rope_theta=theta, rope_scaling=None
    )
    assert _read_config(d).rope_parameters == {"rope_type": "default", "rope_theta": theta}


@pytest.mark.parametrize(
    "change",
    [
        {"tie_word_embeddings": None},  # transformers' default decides
        {"num_key_value_heads": None},
        {"sliding_window": 64},
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ],
)
def test_configs_that_need_interpreting_go_through_transformers(change, tiny_llama_dir, tmp_path):
    d = _edited(tiny_llama_dir, tmp_path / "m", **change)
    config = _read_config(d)
    assert not isinstance(config, ModelConfig)
    assert config.hidden_size == 256


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_scaled_rope_runs_and_matches_transformers(default_model_dir, tmp_path):
    rope = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    path = tiny_model_dir("llama", tmp_path, default_model_dir, rope_parameters=rope)
    assert not isinstance(_read_config(path), ModelConfig)
    prompt = list(range(100, 260))  # longer than the original window, so scaling matters
    engine = LLMEngine.from_pretrained(
        str(path), EngineConfig(kv_cache_bytes=16 << 20), progress=lambda _m: None
    )
    ours = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=6))[0]
    hf = reference_model(path)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        theirs = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            do_sample=False,
            pad_token_id=2,
        )[0, len(prompt) :].tolist()
    assert ours.outputs[0].token_ids == theirs


PROBE = """
import sys
from chatpage.engine.load.loader import load_model
load_model(None, progress=lambda _m: None, weights="int4")
print(sorted(m for m in sys.modules if m.startswith("transformers")))
"""


@pytest.mark.slow  # imports transformers in a process of its own
def test_a_cached_default_start_imports_no_transformers(default_model_dir):
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"num_hidden_layers": "thirty"},
            "num_hidden_layers must be a positive integer, got 'thirty'",
        ),
        ({"rms_norm_eps": -1}, "rms_norm_eps must be a positive number"),
        (
            {"tie_word_embeddings": "yes", "eos_token_id": None},
            "tie_word_embeddings",
        ),  # transformers'
    ],
)
def test_a_config_field_of_the_wrong_kind_is_a_one_line_load_error(
    change, message, tiny_llama_dir, tmp_path
):
    from chatpage.engine.load.loader import ModelLoadError

    d = _edited(tiny_llama_dir, tmp_path / "m", **change)
    with pytest.raises(ModelLoadError, match=message) as err:
        _read_config(d)
    assert "\n" not in str(err.value) and "config.json" in str(err.value)
