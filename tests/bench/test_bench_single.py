"""`chatpage bench single` and `chatpage bench quality` on the tiny model print the promised JSON."""

from __future__ import annotations

import importlib.util
import json

import pytest

from chatpage.bench import quality, single

SINGLE_FIELDS = (
    "weights",
    "threads",
    "prompt_tokens",
    "decode_tok_s",
    "ttft_ms",
    "step_ms",
    "weight_bytes",
    "read_bandwidth_gb_s",
    "floor_ratio",
    "llamacpp_tok_s",
    "ratio_vs_llamacpp",
)


def _run(module, argv, capsys) -> dict:
    assert module.main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow  # runs a benchmark end to end
def test_single_json(tiny_llama_dir, capsys):
    r = _run(
        single,
        [
            "--json",
            "--model",
            str(tiny_llama_dir),
            "--weights",
            "fp32,int4",
            "--prompt-tokens",
            "16",
            "--new-tokens",
            "4",
            "--repeats",
            "2",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert r["benchmark"] == "single" and r["prompt_tokens"] == 16
    assert [row["weights"] for row in r["results"]] == ["fp32", "int4"]
    for row in r["results"]:
        assert all(f in row for f in SINGLE_FIELDS)
        assert row["decode_tok_s"] > 0 and row["floor_ratio"] > 0
        # each pass against the read rate measured around it; the row gives their median
        low, high = sorted(row["round_floor_ratios"])
        assert row["floor_ratio"] == pytest.approx((low + high) / 2, rel=1e-3)
    fp32, int4 = r["results"]
    assert int4["weight_bytes"] < fp32["weight_bytes"] / 4
    assert r["llamacpp_error"]  # a model directory has no GGUF for llama.cpp
    assert r["best_weights"] in ("fp32", "int4")


@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (make test-peers installs it)",
)
def test_single_alternates_with_llamacpp_on_the_default_gguf(capsys):
    r = _run(
        single,
        [
            "--json",
            "--weights",
            "int4",
            "--prompt-tokens",
            "16",
            "--new-tokens",
            "6",
            "--repeats",
            "3",
            "--threads",
            "1",
        ],
        capsys,
    )
    assert "llamacpp_error" not in r and r["rounds"] == 3
    (int4,) = r["results"]
    assert int4["llamacpp_tok_s"] == r["llamacpp_tok_s"] > 0 and r["llamacpp_ttft_ms"] > 0
    rounds = int4["round_ratios_vs_llamacpp"]
    assert len(rounds) == 3 and all(0.05 < x < 20 for x in rounds)
    assert int4["ratio_vs_llamacpp"] == r["best_ratio_vs_llamacpp"] == sorted(rounds)[1]


def test_single_refuses_an_unknown_format(capsys):
    with pytest.raises(SystemExit):
        single.main(["--weights", "fp32,int3"])
    assert "unknown weight format(s) int3" in capsys.readouterr().err


@pytest.mark.slow  # runs a benchmark end to end
def test_quality_json(tiny_qwen2_dir, capsys):
    r = _run(
        quality,
        ["--json", "--model", str(tiny_qwen2_dir), "--weights", "int8", "--threads", "1"],
        capsys,
    )
    assert r["benchmark"] == "quality" and r["text_tokens"] > 500
    fp32, int8 = r["formats"]
    assert fp32["weights"] == "fp32" and fp32["perplexity_delta"] == 0
    assert fp32["greedy_agreement"] == 1 and fp32["greedy_prefix_tokens"] == r["greedy_tokens"]
    assert int8["weights"] == "int8" and int8["perplexity"] > 1
    assert 0.5 <= int8["greedy_agreement"] <= 1 and int8["goal_perplexity_delta"] == 0.02


def test_report_renders_single_and_quality(tmp_path):
    from chatpage.bench import report

    row = {
        "weights": "int4",
        "threads": 1,
        "prompt_tokens": 128,
        "decode_tok_s": 100.0,
        "step_ms": 10.0,
        "matmul_ms": 7.0,
        "ttft_ms": 30.0,
        "weight_bytes": 95e6,
        "read_bandwidth_gb_s": 30.0,
        "floor_ms": 3.2,
        "floor_ratio": 3.1,
        "llamacpp_tok_s": 125.0,
        "ratio_vs_llamacpp": 0.8,
    }
    fp32 = {
        **row,
        "weights": "fp32",
        "decode_tok_s": 30.0,
        "step_ms": 33.0,
        "matmul_ms": 29.0,
        "weight_bytes": 538e6,
        "floor_ms": 18.0,
        "floor_ratio": 1.8,
        "ratio_vs_llamacpp": 0.24,
    }
    single_r = {
        "benchmark": "single",
        "threads": 1,
        "clock": "cpu",
        "prompt_tokens": 128,
        "new_tokens": 128,
        "results": [fp32, row],
        "llamacpp_tok_s": 125.0,
        "llamacpp_ttft_ms": 500.0,
        "best_weights": "int4",
        "vector_isa": "amx",
        "llamacpp_amx": False,  # built by scripts/llamacpp_cmake_args.sh on an AMX machine
    }
    formats = [
        {
            "weights": "fp32",
            "perplexity": 24.0,
            "perplexity_delta": 0.0,
            "greedy_agreement": 1.0,
            "greedy_prefix_tokens": 256,
            "weight_bytes": 538e6,
            "goal_perplexity_delta": None,
            "met": None,
        },
        {
            "weights": "int4",
            "perplexity": 26.0,
            "perplexity_delta": 0.0833,
            "greedy_agreement": 0.9,
            "greedy_prefix_tokens": 12,
            "weight_bytes": 95e6,
            "goal_perplexity_delta": 0.06,
            "met": False,
        },
    ]
    quality_r = {
        "benchmark": "quality",
        "text": "quality.txt",
        "text_tokens": 938,
        "greedy_tokens": 256,
        "formats": formats,
    }
    runs = {
        "single": {"command": "chatpage bench single --json", "seconds": 60.0, "result": single_r},
        "quality": {
            "command": "chatpage bench quality --json",
            "seconds": 90.0,
            "result": quality_r,
        },
    }
    goals = {g.goal: g for g in report.goals({k: v["result"] for k, v in runs.items()})}
    assert goals["decode tok/s at batch 1 (int4)"].met is True
    assert goals["int4 / llama.cpp decode tok/s, same run"].met is False
    assert (
        "llama.cpp without its AMX kernels" in goals["int4 / llama.cpp decode tok/s, same run"].why
    )
    assert goals["fp32 batch-1 step / weight-read floor"].met is False
    assert goals["int4 perplexity vs fp32"].met is False
    text = report.render(runs, tmp_path / "b.md", "test machine", 150.0, "--threads 1")
    assert "| int4 | 100.0 | 10.00 | 7.00 |" in text
    assert "| llama.cpp (GGUF) | 125.0 |" in text
    assert "| int4 | 26.00 | 8.33 | 0.9 | 12 | 95.00 |" in text


@pytest.mark.slow  # runs a benchmark end to end
def test_single_and_quality_print_readable_text_without_json(tiny_llama_dir, capsys):
    model = ["--model", str(tiny_llama_dir), "--threads", "1"]
    assert (
        single.main(
            [
                *model,
                "--weights",
                "int8",
                "--prompt-tokens",
                "8",
                "--new-tokens",
                "3",
                "--repeats",
                "1",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.startswith("benchmark: single\n") and "\n    weights: int8\n" in out
    assert quality.main([*model, "--weights", "int8"]) == 0
    assert capsys.readouterr().out.startswith("benchmark: quality\n")


def test_report_judges_the_best_and_the_default_format_of_throughput():
    from chatpage.bench import report

    formats = [
        {"weights": "fp32", "tok_s": 100.0, "mean_batch": 16.0, "ratio": 4.0},
        {"weights": "bf16", "tok_s": 300.0, "mean_batch": 16.0, "ratio": 12.0},
        {"weights": "int4", "tok_s": 250.0, "mean_batch": 16.0, "ratio": 10.0},
    ]
    throughput_r = {
        "benchmark": "throughput",
        "requests": 48,
        "scale": 0.25,
        "threads": 1,
        "mean_input": 120.0,
        "chatpage_tok_s": 100.0,
        "hf_candidates": [{"batch": 48, "seconds": 150.0, "tok_s": 25.0}],
        "ratio": 4.0,
        "chatpage_mean_batch": 16.0,
        "hf_tok_s": 25.0,
        "hf_batch": 48,
        "longest": 300,
        "mean_output": 80.0,
        "formats": formats,
        "best_weights": "bf16",
        "best_ratio": 12.0,
    }
    goals = {g.goal: g for g in report.goals({"throughput": throughput_r})}
    assert goals["chatpage (bf16) / transformers (fp32) useful tok/s"].met is True
    default = goals["chatpage (int4, the default) / transformers (fp32) useful tok/s"]
    assert default.value == 10.0 and default.target == ">= 12"
    assert default.met is False and "250.0 tok/s" in default.why
