"""Weight formats: packing is exact where it should be, every lower-precision format stays within a
bound of fp32 on the tiny models, packed weights are cached and reused, and bad choices are refused
with a clear message (config, EngineConfig, command line)."""

from __future__ import annotations

import pytest
import torch
from gemv_checks import q8_exact

from chatpage.bench import common
from chatpage.bench.quality import TEXT, all_logits
from chatpage.cli.main import build_parser
from chatpage.config.settings import load_settings
from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.load.loader import load_model, packed_weights_path
from chatpage.engine.model.weights import (
    GEMV_ROWS,
    INT4_GROUP,
    PACKED_LAYOUT,
    make_linear,
    pack_int4,
    quantize_int4,
    quantize_int8,
    state_format,
)
from chatpage.vocab import DEFAULT_WEIGHTS, WEIGHT_FORMATS

# Bounds on the tiny random models (64 positions of real text): top-1 agreement with fp32 and the
# worst relative L2 error of a logits row. Random Gaussian weights are the hard case for int4
# (a trained model's are far easier: `chatpage bench quality`); measured: llama int4 0.59 / 0.21,
# qwen2 int4 0.97 / 0.09, int8 >= 0.94 / <= 0.021, bf16 >= 0.98 / <= 0.008.
BOUNDS = {"bf16": (0.95, 0.02), "int8": (0.90, 0.05), "int4": (0.50, 0.35)}


def test_the_engine_implements_every_format_of_the_vocabulary():
    assert set(GEMV_ROWS) == set(WEIGHT_FORMATS)
    assert DEFAULT_WEIGHTS in WEIGHT_FORMATS


def test_int8_round_trip_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(64, 96)
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16
    err = (q.float() * scale.float()[:, None] - w).abs()
    assert (err <= scale.float()[:, None] * 0.5 + 1e-6).all()
    x = torch.randn(3, 96, dtype=torch.bfloat16)
    y = make_linear({"m.qweight": q, "m.scales": scale}, "m", torch.device("cpu"))(x)
    expected = x.float() @ (q.float() * scale.float()[:, None]).t()
    torch.testing.assert_close(y.float(), expected, rtol=2e-2, atol=2e-2)


def test_int4_is_exact_on_a_16_level_grid():
    """Weights already on a per-group grid (what a GGUF Q4_1 block dequantizes to) come back
    exactly: scale and zero survive bf16, and both layouts' matmuls (the native GEMV for a few
    rows, torch's for more) read the packed nibbles right."""
    torch.manual_seed(0)
    n, k = 64, 4 * INT4_GROUP
    levels = torch.randint(0, 16, (n, k // INT4_GROUP, INT4_GROUP))
    levels[..., 0], levels[..., 1] = 0, 15  # every group spans the 16 levels
    step = 2.0 ** -torch.randint(4, 8, (n, k // INT4_GROUP, 1)).float()
    low = torch.randint(-64, 0, (n, k // INT4_GROUP, 1)) * step
    w = (low + levels * step).view(n, k)
    state = pack_int4(*quantize_int4(w), "m")
    assert state["m.q4"].shape == (n, k // 2) and state["m.scales"].shape == (n, k // INT4_GROUP)
    linear = make_linear(state, "m", torch.device("cpu"))
    for rows in (1, GEMV_ROWS["int4"] + 3):
        x = q8_exact(rows, k)  # integers that the q8 GEMMs' int8 blocks hold exactly
        torch.testing.assert_close(linear(x).float(), x.float() @ w.t(), rtol=1e-2, atol=1e-2)


def test_int4_refuses_inputs_not_divisible_by_the_group():
    with pytest.raises(ValueError, match="divisible by 32"):
        quantize_int4(torch.randn(8, 40))


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "fmt",
    [
        pytest.param("bf16", marks=pytest.mark.slow),
        pytest.param("int8", marks=pytest.mark.slow),
        "int4",
    ],
)
def test_divergence_from_fp32_is_bounded(kind, fmt, tiny_llama_dir, tiny_qwen2_dir):
    loaded = load_model(
        tiny_llama_dir if kind == "llama" else tiny_qwen2_dir, progress=lambda _m: None
    )
    ids = loaded.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=False)[:64]
    ref = all_logits(common.engine(loaded), ids)
    eng = common.engine(loaded, weight_dtype=fmt)
    assert eng.model.weights == fmt
    got = all_logits(eng, ids)
    agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
    rel = ((got - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    min_agree, max_rel = BOUNDS[fmt]
    assert agree >= min_agree and rel <= max_rel, (agree, rel)
    assert rel > 0  # the format really is in use


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_weight_bytes_shrink_with_the_format(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir, progress=lambda _m: None)
    sizes = {f: common.engine(loaded, weight_dtype=f).model.weight_bytes for f in WEIGHT_FORMATS}
    assert sizes["fp32"] > sizes["bf16"] > sizes["int8"] > sizes["int4"]
    assert sizes["bf16"] == pytest.approx(sizes["fp32"] / 2, rel=0.01)


def test_packed_weights_are_cached_and_reused(tiny_qwen2_dir):
    path = packed_weights_path(tiny_qwen2_dir, "int4")
    path.unlink(missing_ok=True)
    messages: list[str] = []
    first = load_model(tiny_qwen2_dir, progress=messages.append, weights="int4")
    assert path.is_file() and any("Packing" in m for m in messages)
    assert state_format(first.state) == "int4" and first.weights == "int4"
    assert "model.embed_tokens.weight" not in first.state
    stamp = path.stat().st_mtime_ns
    messages.clear()
    second = load_model(tiny_qwen2_dir, progress=messages.append, weights="int4")
    assert path.stat().st_mtime_ns == stamp and not any("Packing" in m for m in messages)

    def answer(loaded) -> list[int]:
        eng = LLMEngine(loaded, EngineConfig(kv_cache_bytes=8 << 20, weight_dtype="int4"))
        (out,) = eng.generate(
            [[1, 100, 200, 300]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        )
        return out.outputs[0].token_ids

    fresh = load_model(tiny_qwen2_dir, progress=lambda _m: None)  # fp32, packed by the engine
    assert answer(second) == answer(fresh)


def test_a_cache_in_another_layout_is_packed_again(tiny_qwen2_dir):
    """The cache file's name carries the layout version: a file of an older layout (int4 in
    torch's layout only, under the old name) is never read as the current one, and goes once
    the current one is written (the other formats' files stay)."""
    from safetensors.torch import save_file

    path = packed_weights_path(tiny_qwen2_dir, "int4")
    assert path.name == f"int4.v{PACKED_LAYOUT}.safetensors"
    path.unlink(missing_ok=True)
    old = path.with_name("int4.safetensors")
    old.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {
            "format.int4": torch.zeros(0),
            "layers.0.qkv.packed": torch.zeros(16, 16, dtype=torch.uint8),
        },
        old,
    )
    other = path.with_name("int8.safetensors")
    other.write_bytes(b"")
    messages: list[str] = []
    loaded = load_model(tiny_qwen2_dir, progress=messages.append, weights="int4")
    assert any("Packing" in m for m in messages) and path.is_file()
    assert "layers.0.qkv.q4" in loaded.state and loaded.state["layers.0.qkv.q4"].numel() > 256
    assert not old.exists() and other.exists()
    other.unlink()


def test_a_state_packed_in_another_format_is_refused(tiny_llama_dir):
    loaded = load_model(tiny_llama_dir, progress=lambda _m: None, weights="int8")
    with pytest.raises(ValueError, match="packed as int8, not int4"):
        LLMEngine(loaded, EngineConfig(kv_cache_bytes=8 << 20, weight_dtype="int4"))


def test_engine_config_checks_weights_and_threads():
    with pytest.raises(ValueError, match="weight_dtype.*int3.*fp32, bf16, int8, int4"):
        EngineConfig(weight_dtype="int3")
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        EngineConfig(num_threads=0)
    assert EngineConfig(num_threads=3).threads == 3
    assert EngineConfig().threads >= 1


def test_weights_setting_and_flags(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("weights: int8\n")
    settings, warnings = load_settings(cfg)
    assert settings.weights == "int8" and not warnings
    settings, _ = load_settings(cfg, overrides={"weights": "bf16"})
    assert settings.weights == "bf16" and settings.sources["weights"] == "command line"
    cfg.write_text("weights: int3\n")
    settings, warnings = load_settings(cfg)
    assert settings.weights == DEFAULT_WEIGHTS
    assert any("weights" in w and "fp32 or bf16 or int8 or int4" in w for w in warnings)

    args = build_parser().parse_args(["ask", "hi", "--weights", "int4", "--threads", "2"])
    assert (args.weights, args.threads) == ("int4", 2)
    for bad in (["--weights", "int3"], ["--threads", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["ask", "hi", *bad])
        assert bad[0] in capsys.readouterr().err


def test_kv_cache_dtype_setting_and_flag(tmp_path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("kv_cache_dtype: int8\n")
    settings, warnings = load_settings(cfg)
    assert settings.kv_cache_dtype == "int8" and not warnings
    assert EngineConfig.for_settings(settings).kv_cache_dtype == "int8"
    settings, _ = load_settings(cfg, overrides={"kv_cache_dtype": "bf16"})
    assert (
        settings.kv_cache_dtype == "bf16" and settings.sources["kv_cache_dtype"] == "command line"
    )
    cfg.write_text("kv_cache_dtype: fp4\n")
    settings, warnings = load_settings(cfg)
    assert settings.kv_cache_dtype == "auto"
    assert any("kv_cache_dtype" in w and "auto or bf16 or int8" in w for w in warnings)
    with pytest.raises(ValueError, match="kv_cache_dtype must be 'auto' or 'bf16' or 'int8'"):
        EngineConfig(kv_cache_dtype="fp8")
    for command in (["ask", "hi"], ["serve"], []):
        args = build_parser().parse_args([*command, "--kv-cache-dtype", "int8"])
        assert args.kv_cache_dtype == "int8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ask", "hi", "--kv-cache-dtype", "int4"])
    assert "--kv-cache-dtype" in capsys.readouterr().err


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_prefill_chunks_without_logits(fmt, tiny_llama_dir):
    """Chunked prefill (steps whose rows need no logits) then decode, in a quantized format."""
    loaded = load_model(tiny_llama_dir, progress=lambda _m: None)
    eng = LLMEngine(
        loaded, EngineConfig(kv_cache_bytes=8 << 20, weight_dtype=fmt, max_num_batched_tokens=32)
    )
    (out,) = eng.generate(
        [list(range(100, 200))], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    )
    assert len(out.outputs[0].token_ids) == 3


def test_misaligned_packed_weights_are_realigned():
    """A tensor read from safetensors can start at any address; torch's int8 kernel segfaults on
    a misaligned weight from 4 rows on, so make_linear must hand it an aligned copy."""
    torch.manual_seed(0)
    w = torch.randn(256, 128)
    q, scale = quantize_int8(w)
    buffer = torch.empty(q.numel() + 64, dtype=torch.int8)
    start = next(i for i in range(1, 64) if (buffer.data_ptr() + i) % 64)
    shifted = buffer[start : start + q.numel()].view_as(q)
    shifted.copy_(q)
    assert shifted.data_ptr() % 64 != 0
    linear = make_linear({"m.qweight": shifted, "m.scales": scale}, "m", torch.device("cpu"))
    x = q8_exact(8, 128)  # exact on every kernel, the q8 GEMMs' included
    expected = x.float() @ (q.float() * scale.float()[:, None]).t()
    torch.testing.assert_close(linear(x).float(), expected, rtol=2e-2, atol=5e-2)
