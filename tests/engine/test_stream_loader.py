"""The dense weights of an HF checkpoint stream tensor by tensor onto the device (engine/load/stream.py):
the same model as reading the whole file, and a host peak well below the checkpoint's fp32 size
(the path a GPU load takes, run here with the CPU as the device)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from chatpage.engine.load.loader import load_model
from chatpage.engine.load.stream import StreamedState, read_header, streamed_checkpoint
from chatpage.engine.model.llama import LlamaModel

ROOT = Path(__file__).resolve().parents[2]


def test_a_streamed_tensor_is_the_stored_one(tmp_path):
    tensors = {
        "a": torch.randn(3, 5),
        "b": torch.arange(7, dtype=torch.int64),
        "c": torch.randn(2, 2).to(torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }
    save_file(tensors, tmp_path / "x.safetensors", metadata={"format": "pt"})
    assert set(read_header(tmp_path / "x.safetensors")) == set(tensors)
    state = StreamedState(
        [tmp_path / "x.safetensors"],
        torch.device("cpu"),
        lambda name: torch.float16 if name == "a" else None,
    )
    assert len(state) == 4 and "a" in state and "zzz" not in state
    assert torch.equal(state["a"], tensors["a"].half()) and state["a"].dtype == torch.float16
    assert torch.equal(state["b"], tensors["b"])  # integers keep their dtype
    assert torch.equal(state["c"], tensors["c"]) and state["empty"].shape == (0, 4)
    state["d"] = torch.ones(1)
    assert torch.equal(state.pop("d"), torch.ones(1)) and "d" not in state
    del state["a"]
    assert sorted(state) == ["b", "c", "empty"]
    with pytest.raises(KeyError):
        del state["a"]


@pytest.mark.parametrize("weights", ["fp32", "bf16"])
def test_streamed_loading_builds_the_same_model(tiny_llama_dir, weights):
    streamed = load_model(str(tiny_llama_dir), lambda _m: None, weights)
    assert isinstance(streamed.state, StreamedState)
    whole = load_file(tiny_llama_dir / "model.safetensors")
    a = LlamaModel(streamed.config, streamed.state, torch.float32, "cpu", weights)
    b = LlamaModel(streamed.config, whole, torch.float32, "cpu", weights)
    x = torch.randn(3, a.hidden).to(a.mm_dtype)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.input_norm, lb.input_norm)
        for name in ("qkv", "o", "gate_up"):
            assert torch.equal(getattr(la, name)(x), getattr(lb, name)(x))
    ids = torch.arange(a.vocab_size)
    assert torch.equal(a.embed(ids), b.embed(ids))


_CHILD = textwrap.dedent("""
    import json, os, sys
    import torch
    from chatpage.engine.load.loader import _read_tokenizer, load_model
    from chatpage.engine.model.llama import LlamaModel

    from pathlib import Path
    path = Path(sys.argv[1])
    _read_tokenizer(path)  # transformers' import is no part of the weights' peak
    page = os.sysconf("SC_PAGE_SIZE")
    before = int(open("/proc/self/statm").read().split()[1]) * page
    loaded = load_model(str(path), lambda _m: None, "bf16")
    model = LlamaModel(loaded.config, loaded.state, torch.float32, "cpu", "bf16")
    # VmHWM, not getrusage's ru_maxrss: that one is kept across exec, so a child started by a
    # large process would report the parent's peak
    status = open("/proc/self/status").read()
    peak = int(status.split("VmHWM:")[1].split()[0]) * 1024
    print(json.dumps({"before": before, "peak": peak, "weights": model.weight_bytes}))
""")


def _big_checkpoint(root: Path, tokenizer_dir: Path) -> Path:
    """A Llama checkpoint of ~100 M fp32 parameters (6 layers of 16.8 M, 403 MB), written as it
    is (the values do not matter to memory; random initialisation would cost most of the test)."""
    from transformers import AutoTokenizer, LlamaConfig

    hidden, inter, layers, vocab = 1024, 4096, 6, 4096
    LlamaConfig(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=16,
        vocab_size=vocab,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    ).save_pretrained(root)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(root)
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + f"self_attn.{x}_proj.weight": (hidden, hidden) for x in "qkvo"})
        shapes.update(
            {
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
            }
        )
    save_file(
        {name: torch.full(shape, 0.01) for name, shape in shapes.items()},
        root / "model.safetensors",
    )
    return root


@pytest.mark.slow  # streams a checkpoint in a process of its own
def test_the_host_peak_stays_well_below_the_fp32_checkpoint(tmp_path, default_model_dir):
    model_dir = _big_checkpoint(tmp_path / "big", default_model_dir)
    fp32_bytes = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    assert fp32_bytes > 380e6
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model_dir)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    grown = seen["peak"] - seen["before"]
    # the bf16 model itself is about half the checkpoint; reading it whole (or through an mmap
    # that stays resident) adds the full fp32 size on top (measured: 0.68x streamed before the
    # per-tensor packing of the GGUF work, 0.80x with it; 1.47x whole)
    assert grown < 0.85 * fp32_bytes, (grown, fp32_bytes)
    assert seen["weights"] < 0.6 * fp32_bytes


def test_no_safetensors_means_no_stream(tmp_path):
    assert streamed_checkpoint(tmp_path, torch.device("cpu"), torch.float32, torch.float32) is None
