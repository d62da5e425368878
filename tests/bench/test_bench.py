"""Benchmarks: every command runs on the tiny model at a tiny scale and prints the promised JSON;
the workload generator, the reservation baselines and the report are checked on their own."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest
import torch

from chatpage.bench import (
    kv,
    memory,
    prefix,
    report,
    resume,
    serve,
    sharing,
    structured,
    throughput,
)
from chatpage.bench.reservation import ReservationScheduler, reservation, simulate
from chatpage.bench.serve import sustainable_rate
from chatpage.bench.workloads import (
    ALPACA,
    SHAREGPT,
    BenchRequest,
    chat_sessions,
    describe,
    make_trace,
    max_len_at,
    with_poisson_arrivals,
)


def _run(module, argv, capsys) -> dict:
    assert module.main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return json.loads(last)


def _has(result: dict, *fields: str) -> None:
    missing = [f for f in fields if f not in result]
    assert not missing, f"missing fields {missing}"


# -- workloads ------------------------------------------------------------------------------------
def test_traces_are_seeded_and_shaped():
    a = make_trace(SHAREGPT, 48, scale=0.25, seed=3)
    assert a == make_trace(SHAREGPT, 48, scale=0.25, seed=3)
    assert a != make_trace(SHAREGPT, 48, scale=0.25, seed=4)
    d = describe(a)
    assert d["requests"] == 48
    assert d["mean_input"] == pytest.approx(161.31 * 0.25, rel=0.1)
    assert d["mean_output"] == pytest.approx(337.99 * 0.25, rel=0.1)
    assert d["longest"] <= max_len_at(0.25)
    assert all(r.prompt_len >= 1 and r.output_len >= 1 for r in a)
    alpaca = describe(make_trace(ALPACA, 64, seed=0))
    assert alpaca["mean_input"] == pytest.approx(19.31, rel=0.1)
    assert alpaca["mean_output"] == pytest.approx(58.45, rel=0.1)


def test_text_prompts_and_poisson_arrivals():
    text = list(range(500, 520))
    trace = make_trace(ALPACA, 5, text_tokens=text)
    assert all(set(r.prompt_ids) <= set(text) for r in trace)
    timed = with_poisson_arrivals(trace, rate=2.0)
    times = [r.arrival_s for r in timed]
    assert times == sorted(times) and times[0] > 0
    assert [r.output_len for r in timed] == [r.output_len for r in trace]


def test_chat_sessions_use_shipped_personas():
    sessions = chat_sessions(3, turns=4, num_personas=2)
    assert len({s.persona for s in sessions}) == 2
    assert all(len(s.user_turns) == 4 == len(s.reply_tokens) for s in sessions)
    assert all(s.system_prompt for s in sessions)


# -- reservation baselines ----------------------------------------------------------------------
def test_reservation_sizes():
    r = BenchRequest([1] * 10, 23)
    assert reservation("max", r, 64) == 64
    assert reservation("pow2", r, 64) == 64 and reservation("pow2", BenchRequest([1], 15), 64) == 16
    assert reservation("oracle", r, 64) == 33
    with pytest.raises(ValueError):
        reservation("nope", r, 64)


def test_simulate_one_request_by_hand():
    # prompt 4, output 4: live tokens after iterations 1..3 are 4, 5, 6 (finished after the 4th)
    trace = [BenchRequest([1] * 4, 4)]
    oracle = simulate(trace, "oracle", 64, max_len=64)
    assert oracle.utilization == pytest.approx((4 + 5 + 6) / 3 / 8)
    assert oracle.iterations == 4 and oracle.max_batch == 1
    mx = simulate(trace, "max", 64, max_len=64)
    assert mx.utilization == pytest.approx((4 + 5 + 6) / 3 / 64)


def test_simulate_budget_limits_the_batch():
    trace = [BenchRequest([1] * 8, 8) for _ in range(8)]
    assert simulate(trace, "oracle", 64, max_len=64).max_batch == 4
    assert simulate(trace, "max", 64, max_len=32).max_batch == 2
    with pytest.raises(ValueError):
        simulate(trace, "max", 16, max_len=32)


def test_an_engine_sized_in_blocks_has_that_many_of_its_kv_dtype(tiny_llama_dir):
    """``blocks`` counts blocks of the KV dtype the engine runs with (bf16 blocks are half an
    fp32 one's bytes: sized as fp32 the pool would have twice the blocks asked for)."""
    from chatpage.bench import common

    loaded = common.load(str(tiny_llama_dir))
    for kv_dtype in ("auto", "bf16"):
        eng = common.engine(loaded, blocks=6, kv_cache_dtype=kv_dtype)
        assert eng.stats().num_blocks == 6, kv_dtype


@pytest.mark.slow  # runs a benchmark end to end
def test_reservation_scheduler_admits_only_what_fits(tiny_llama_dir):
    from chatpage.bench import common
    from chatpage.engine import SamplingParams

    loaded = common.load(str(tiny_llama_dir))
    eng = common.engine(loaded, blocks=4)
    # each request reserves 4 + 28 tokens = 2 blocks: two fit in 4 blocks, not three
    eng.scheduler = ReservationScheduler(
        eng.config, eng.bm, eng.stop, {f"r{i}": 32 for i in range(3)}
    )
    for i in range(3):
        eng.add_request(
            [100 + i] * 4,
            SamplingParams(temperature=0, max_tokens=28, ignore_eos=True),
            request_id=f"r{i}",
        )
    eng.step()
    assert len(eng.scheduler.running) == 2
    assert isinstance(eng.scheduler.waiting, deque) and len(eng.scheduler.waiting) == 1
    # unknown requests reserve prompt + max_tokens; everything still completes
    eng.add_request([7, 8], SamplingParams(temperature=0, max_tokens=2))
    assert common.drain(eng) > 0 and not eng.scheduler.has_work()


def test_sustainable_rate_interpolates():
    assert sustainable_rate([(1, 0.1), (2, 0.2), (3, 0.6)], 0.4) == (2.5, "interpolated")
    assert sustainable_rate([(1, 0.1), (2, 0.2)], 0.4) == (2, "at least")
    assert sustainable_rate([(2, 0.8)], 0.4) == (1.0, "extrapolated")


# -- the commands on the tiny model -----------------------------------------------------------------
@pytest.mark.slow  # runs a benchmark end to end
def test_throughput_json(tiny_llama_dir, capsys):
    r = _run(
        throughput,
        [
            "--json",
            "--model",
            str(tiny_llama_dir),
            "--scale",
            "0.02",
            "--requests",
            "4",
            "--hf-batches",
            "2,4",
            "--roofline-batch",
            "4",
        ],
        capsys,
    )
    _has(
        r,
        "requests",
        "prompt_tokens",
        "output_tokens",
        "chatpage_tok_s",
        "hf_tok_s",
        "ratio",
        "chatpage_mean_batch",
        "gemm_bound_tok_s",
        "fraction_of_gemm_bound",
        "batch1_step_ms",
        "weight_read_floor_ms",
        "batch1_floor_ratio",
        "scale",
    )
    assert r["scale"] == 0.02 and r["requests"] == 4
    assert r["hf_batch"] in (2, 4) and r["ratio"] > 0


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_memory_json(tiny_llama_dir, capsys):
    r = _run(memory, ["--json", "--model", str(tiny_llama_dir), "--scale", "0.05"], capsys)
    _has(
        r,
        "chatpage_utilization",
        "max_utilization",
        "pow2_utilization",
        "oracle_utilization",
        "chatpage_mean_batch",
        "max_mean_batch",
        "pow2_mean_batch",
        "oracle_mean_batch",
        "chatpage_max_batch",
        "scale",
    )
    for key in ("chatpage", "max", "pow2", "oracle"):
        assert 0 < r[f"{key}_utilization"] <= 1
    assert r["max_utilization"] <= r["oracle_utilization"]
    capacity = r["kv_capacity"]  # real engines' pools of 1 GiB
    for dtype in ("bf16", "int8"):
        blocks, block = capacity[dtype]["blocks"], capacity[dtype]["bytes_per_block"]
        assert blocks == (1 << 30) // block and capacity[dtype]["chats"] == blocks // 256
    assert capacity["int8_vs_bf16_chats"] >= 1.9 and capacity["met"]


@pytest.mark.slow  # two engines decoding at three batch sizes
def test_kv_json(tiny_llama_dir, capsys, tmp_path):
    argv = ["--json", "--model", str(tiny_llama_dir), "--scale", "0.02", "--weights", "fp32"]
    r = _run(kv, argv, capsys)
    assert r["context"] == 82 and [row["batch"] for row in r["rows"]] == list(kv.BATCHES)
    for row in r["rows"]:
        assert row["int8_tok_s"] > 0 and row["bf16_tok_s"] > 0
        assert row["speedup"] == pytest.approx(row["int8_tok_s"] / row["bf16_tok_s"], rel=1e-3)
    text = report.render(
        {"kv": {"command": "chatpage bench kv --json", "seconds": 1.0, "result": r}},
        tmp_path / "b.md",
        "test machine",
        1.0,
    )
    assert "| kv | int8 / bf16 KV decode tok/s, batch 1 |" in text


def test_kv_at_one_batch_alone_asks_only_what_its_pool_holds(tiny_llama_dir, capsys):
    """A run of batch 1 alone sizes its pool for one sequence: its request asks for the tokens the
    run takes (once it asked for 512, more than that pool, and was refused)."""
    argv = ["--json", "--model", str(tiny_llama_dir), "--scale", "0.05", "--weights", "fp32"]
    r = _run(kv, [*argv, "--batches", "1"], capsys)
    assert [row["batch"] for row in r["rows"]] == [1] and r["rows"][0]["context"] == 205


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_serve_json(tiny_llama_dir, capsys):
    r = _run(
        serve,
        [
            "--json",
            "--model",
            str(tiny_llama_dir),
            "--scale",
            "0.05",
            "--requests",
            "4",
            "--rates",
            "2,50",
        ],
        capsys,
    )
    _has(
        r,
        "sustainable_rate_chatpage",
        "sustainable_rate_oracle",
        "rate_ratio",
        "rates",
        "latency_bound_s",
        "scale",
    )
    assert {x["system"] for x in r["rates"]} == {"chatpage", "oracle"}
    _has(
        r["rates"][0],
        "rate",
        "normalized_latency_s",
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "mean_batch",
    )


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_prefix_json(tiny_llama_dir, capsys):
    r = _run(
        prefix,
        [
            "--json",
            "--model",
            str(tiny_llama_dir),
            "--scale",
            "0.1",
            "--sessions",
            "2",
            "--turns",
            "3",
        ],
        capsys,
    )
    _has(r, "ttft_ratio", "cold_ttft_s", "cached_ttft_s", "turns", "scale")
    assert r["cached_prefix_hit_tokens"] >= 16 * ((r["persona_prefix_tokens"] - 1) // 16) - 16
    assert len(r["turns"]) == 3
    for t in r["turns"]:
        _has(t, "prompt_tokens", "new_tokens", "computed_tokens")
        assert t["computed_tokens"] == t["prompt_tokens"] - t["prefix_hit_tokens"]
        assert t["computed_tokens"] <= t["new_tokens"] + 16
    assert len(r["turns_retokenized"]) == 3  # (tests/chat/test_reply_ids.py shows they diverge)


@pytest.mark.slow  # engines started and stopped over a tier, each way
def test_resume_json(tiny_llama_dir, capsys):
    r = _run(
        resume,
        ["--json", "--model", str(tiny_llama_dir), "--scale", "0.05", "--rounds", "1"],
        capsys,
    )
    (run,) = r["runs"]
    _has(run, "resume_ttft_s", "recompute_ttft_s", "resume_ratio", "tier_throughput_ratio")
    assert run["resume_disk_tokens"] == run["resume_hit_tokens"] >= run["history_tokens"] - 16
    assert run["tier_files"] == run["history_tokens"] // 16
    assert run["warm_pin_steps"] == 0 < run["cold_pin_steps"]
    _has(run, "ahead_ttft_s", "no_ahead_ttft_s", "ahead_longest_step_s")
    assert run["ahead_blocks"] > 0  # (the next turn's blocks read while the other chat ran)
    goals = resume.goals(resume.SECTION.read(r))
    assert [g.met for g in goals if "persona" in g.goal] == [True]


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_sharing_json(tiny_llama_dir, capsys):
    r = _run(
        sharing,
        ["--json", "--model", str(tiny_llama_dir), "--scale", "0.02", "--requests", "1"],
        capsys,
    )
    _has(r, "results", "beam4_tok_s", "independent4_tok_s", "beam4_vs_independent", "scale")
    combos = {(x["workload"], x["mode"], x["width"]) for x in r["results"]}
    assert combos == {
        (w, m, k) for w in ("alpaca", "sharegpt") for m in ("parallel", "beam") for k in (2, 4, 6)
    }
    assert all(0 <= x["saving"] < 1 for x in r["results"])
    beam6 = [x["saving"] for x in r["results"] if x["mode"] == "beam" and x["width"] == 6]
    assert min(beam6) > 0  # beams share their prompt at least


def test_structured_json(tiny_llama_dir, capsys):
    r = _run(
        structured,
        ["--json", "--model", str(tiny_llama_dir), "--scale", "0.1", "--weights", "fp32"],
        capsys,
    )
    _has(r, "results", "tokens", "grammar_engine")
    assert [x["rows"] for x in r["results"]] == [1, 32]
    for x in r["results"]:
        assert x["free_tok_s"] > 0 and x["json_schema_tok_s"] > 0 and x["speculating_tok_s"] > 0
        assert 0 < x["mask_share"] < 1  # the constrained run did compute masks
    text = report.render(
        {
            "structured": {
                "command": "chatpage bench structured --json",
                "seconds": 1.0,
                "returncode": 0,
                "result": r,
            }
        },
        Path("b.md"),
        "test machine",
        1.0,
    )
    assert "| structured | mask time / decode step, 32 rows |" in text
    assert "| speculating tok/s | speculating / not |" in text


def test_report_renders_goals(tmp_path):
    runs = {
        "memory": {
            "command": "chatpage bench memory --json",
            "seconds": 1.0,
            "returncode": 0,
            "result": {
                "chatpage_utilization": 0.98,
                "max_utilization": 0.2,
                "pow2_utilization": 0.3,
                "oracle_utilization": 0.4,
                "chatpage_mean_batch": 9,
                "max_mean_batch": 2,
                "pow2_mean_batch": 4,
                "oracle_mean_batch": 5,
                "chatpage_max_batch": 12,
                "max_max_batch": 2,
                "pow2_max_batch": 5,
                "oracle_max_batch": 6,
                "requests": 4,
                "scale": 1.0,
                "mean_input": 160,
                "mean_output": 330,
                "kv_budget_tokens": 6144,
                "max_policy_len": 2048,
                "block_size": 16,
            },
        },
        "prefix": {
            "command": "chatpage bench prefix",
            "seconds": 1.0,
            "returncode": 1,
            "error": "no JSON",
        },
    }
    text = report.render(runs, tmp_path / "b.md", "test machine", 2.0)
    assert "| memory | chatpage KV utilization | 0.98 | >= 0.97 | met |" in text
    assert "**Failed:** no JSON" in text
    assert '"chatpage_utilization": 0.98' in text


# -- --json and text ------------------------------------------------------------------------------
@pytest.mark.slow  # runs a benchmark end to end
def test_soak_bench_reports_every_request_ended(capsys):
    from chatpage.bench import soak

    r = _run(soak, ["--json", "--requests", "40"], capsys)
    _has(r, "requests", "finished", "errored", "hung", "leaked_blocks", "steps", "seconds")
    assert r["requests"] == 40 and r["hung"] == 0 and r["leaked_blocks"] == 0


@pytest.mark.slow  # runs a benchmark end to end
def test_without_json_a_bench_prints_readable_text(capsys):
    from chatpage.bench import soak

    assert soak.main(["--requests", "9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("requests: 9\n") and "hung: 0\n" in out
    assert "preemptions:\n  recompute:\n    swap: " in out


@pytest.mark.slow  # runs a benchmark end to end
def test_kernel_bench_takes_json(capsys):
    from chatpage.bench import kernel

    r = _run(kernel, ["--json", "--repeats", "1"], capsys)
    _has(r, "cases", "goals", "kernels")
    assert len(r["cases"]) == 10


def test_report_reads_back_what_it_wrote(tmp_path):
    soak_result = {
        "requests": 40,
        "finished": 30,
        "errored": 1,
        "failed_by_others": 0,
        "extreme": 2,
        "hung": 0,
        "leaked_blocks": 3,
        "steps": 99,
        "seconds": 1.5,
        "aborted": 8,
        "rejected": 1,
        "greedy_checked": 4,
        "greedy_mismatches": 0,
        "preemptions": {"swap": {"swap": 5, "recompute": 0}},
    }
    runs = {
        "soak": {
            "command": "chatpage bench soak --json",
            "seconds": 2.0,
            "returncode": 0,
            "result": soak_result,
        },
        "prefix": {
            "command": "chatpage bench prefix",
            "seconds": 1.0,
            "returncode": 1,
            "error": "no JSON",
        },
    }
    text = report.render(runs, tmp_path / "b.md", "test machine", 3.0)
    assert "| soak | KV blocks left allocated after the soak | 3 | 0 | **missed** |" in text
    assert "| soak | requests that never ended | 0 | 0 | met |" in text
    back, machine = report.read_back(text)
    assert machine == "test machine"
    assert back == {"soak": runs["soak"]}  # a failed section has no JSON to read back


def test_a_rerun_keeps_the_rest_of_the_report_as_it_was(tmp_path):
    """``--only``: the rerun sections and their goal rows are the new ones; every other section
    and row stays as it was, hand-written notes and sections with no JSON included; a section new
    to the report goes where the registry's order puts it."""
    soak_run = {
        "command": "chatpage bench soak --json",
        "seconds": 2.0,
        "returncode": 0,
        "result": {
            "requests": 40, "finished": 30, "errored": 1, "failed_by_others": 0, "extreme": 2,
            "hung": 0, "leaked_blocks": 3, "steps": 99, "seconds": 1.5, "aborted": 8,
            "rejected": 1, "greedy_checked": 4, "greedy_mismatches": 0,
            "preemptions": {"swap": {"swap": 5, "recompute": 0}},
        },
    }  # fmt: skip
    hand_row = "| quality | a hand-kept goal | 1 | >= 1 | met | by hand |"
    hand_section = "## quality\n\nA section written by hand, with no JSON.\n\n"
    old = report.render({"soak": soak_run}, tmp_path / "b.md", "old machine", 3.0)
    old = old.replace("| soak |", hand_row + "\n| soak |", 1).replace(
        "## soak", hand_section + "## soak"
    )
    old = old.replace("## soak\n", "## soak\n\nA note by hand.\n", 1)
    fixed = {**soak_run, "result": {**soak_run["result"], "leaked_blocks": 0}}
    failed = {"command": "chatpage bench prefix", "seconds": 1.0, "returncode": 1, "error": "x"}
    new = report.render({"soak": fixed, "prefix": failed}, tmp_path / "b.md", "new machine", 1.0)
    text = report.splice(old, new, ["soak", "prefix"])
    assert "Machine: old machine." in text and hand_row in text and hand_section in text
    assert "A note by hand." not in text  # (in the rerun section)
    assert "| soak | KV blocks left allocated after the soak | 0 | 0 | met |" in text
    assert "leaked after the soak | 3" not in text and text.count("| soak | requests that") == 1
    assert text.index("## quality") < text.index("## prefix") < text.index("## soak")
    assert report.splice(old, report.render({}, tmp_path / "b.md", "m", 0.0), []) == old


SERVE_API = {  # a run of `chatpage bench serve --api --concurrency 64 --output-tokens 32`
    "benchmark": "serve_api",
    "workload": "sharegpt",
    "clock": "cpu",
    "mean_input": 31.8,
    "mean_output": 32.0,
    "concurrency": 64,
    "in_process": {
        "rate": 3.28,
        "ttft_p50": 3.47,
        "ttft_p99": 7.51,
        "tpot_p50": 0.508,
        "wall_s": 19.5,
        "engine_thread_cpu_s": 19.42,
    },
    "api": {
        "rate": 2.77,
        "ttft_p50": 4.24,
        "ttft_p99": 8.19,
        "tpot_p50": 0.596,
        "wall_s": 23.2,
        "engine_thread_cpu_s": 21.66,
        "api_latency_p50_ms": 21.9,
        "api_latency_p99_ms": 100.3,
        "streamed_tokens": 2048,
    },
    "api_overhead_ms": 0.19,
    "server_thread_ms": 0.2024,
    "client_ms": 0.3826,
    "wall_added_ms": 1.79,
    "goal_api_overhead_ms": 1.0,
}


@pytest.mark.parametrize(("overhead", "status"), [(0.19, "met"), (1.25, "**missed**")])
def test_report_renders_the_serve_overhead_goal(tmp_path, overhead, status):
    entry = {
        "command": "chatpage bench serve --api --json --concurrency 64",
        "seconds": 50.0,
        "returncode": 0,
        "result": {**SERVE_API, "api_overhead_ms": overhead},
    }
    text = report.render({"serve_api": entry}, tmp_path / "b.md", "test machine", 50.0)
    row = f"| serve_api | serve overhead per streamed token at 64 streams, ms | {overhead} | <= 1 |"
    assert f"{row} {status} |" in text
    assert "the server's loop thread spent 0.202 ms a token" in text
    assert f"serving adds **{overhead:.3f} ms** (cpu clock)" in text
    assert report.read_back(text)[0] == {"serve_api": entry}
    cmd = report.command("serve_api", tmp_path, ["--threads", "1"])
    assert cmd[3:] == [
        "bench", "serve", "--api", "--json", "--concurrency", "64", "--output-tokens", "32",
        "--threads", "1",
    ]  # fmt: skip


def test_transformers_reads_a_gguf_models_own_file(tmp_path):
    """The side the benchmarks compare with, for a model read from a .gguf (whose cache folder
    holds only the tokenizer): transformers' model of the same file, the same weights."""
    from gguf_files import write_gguf

    from chatpage.bench import common
    from chatpage.engine.load.loader import load_model

    loaded = load_model(write_gguf(tmp_path / "tiny.gguf"), progress=lambda _m: None)
    assert loaded.gguf is not None and not (loaded.directory / "config.json").exists()
    model = common.transformers_model(loaded.directory, loaded.gguf, torch.float32)
    assert torch.equal(model.model.embed_tokens.weight, loaded.state["model.embed_tokens.weight"])
    with pytest.raises(ValueError, match="give an HF folder or a .gguf"):
        common.transformers_model(None, None, torch.float32)
