"""`chatpage bench single` and `chatpage bench quality` on the tiny model print the promised JSON."""

from __future__ import annotations

import json

import pytest

from chatpage.bench import quality, single

SINGLE_FIELDS = ("weights", "threads", "prompt_tokens", "decode_tok_s", "ttft_ms", "step_ms",
                 "weight_bytes", "read_bandwidth_gb_s", "floor_ratio", "llamacpp_tok_s",
                 "ratio_vs_llamacpp")


def _run(module, argv, capsys) -> dict:
    assert module.main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_single_json(tiny_llama_dir, capsys):
    r = _run(single, ["--json", "--model", str(tiny_llama_dir), "--weights", "fp32,int4",
                      "--prompt-tokens", "16", "--new-tokens", "4", "--repeats", "1",
                      "--threads", "1"], capsys)
    assert r["benchmark"] == "single" and r["prompt_tokens"] == 16
    assert [row["weights"] for row in r["results"]] == ["fp32", "int4"]
    for row in r["results"]:
        assert all(f in row for f in SINGLE_FIELDS)
        assert row["decode_tok_s"] > 0 and row["floor_ratio"] > 0
    fp32, int4 = r["results"]
    assert int4["weight_bytes"] < fp32["weight_bytes"] / 4
    assert r["llamacpp_error"]  # a model directory has no GGUF for llama.cpp
    assert r["best_weights"] in ("fp32", "int4")


def test_single_refuses_an_unknown_format(capsys):
    with pytest.raises(SystemExit):
        single.main(["--weights", "fp32,int3"])
    assert "unknown weight format(s) int3" in capsys.readouterr().err


def test_quality_json(tiny_qwen2_dir, capsys):
    r = _run(quality, ["--json", "--model", str(tiny_qwen2_dir), "--weights", "int8",
                       "--threads", "1"], capsys)
    assert r["benchmark"] == "quality" and r["text_tokens"] > 500
    fp32, int8 = r["formats"]
    assert fp32["weights"] == "fp32" and fp32["perplexity_delta"] == 0
    assert fp32["greedy_agreement"] == 1 and fp32["greedy_prefix_tokens"] == r["greedy_tokens"]
    assert int8["weights"] == "int8" and int8["perplexity"] > 1
    assert 0.5 <= int8["greedy_agreement"] <= 1 and int8["goal_perplexity_delta"] == 0.02
