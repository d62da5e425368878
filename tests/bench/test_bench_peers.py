"""`chatpage bench peers`' own machinery (the vLLM runs themselves are `make bench-peers`): one
server alive at a time, stopped as a whole process group, and the comparison it reports."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from chatpage.bench import peers

SERVER = textwrap.dedent("""
    import http.server, subprocess, sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a worker
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.end_headers()
            self.wfile.write(b'{"data": [{"id": "fake"}]}')
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


@pytest.mark.slow  # runs a benchmark end to end
def test_a_server_and_its_workers_are_gone_after_the_run(tmp_path: Path) -> None:
    port = peers.free_port()
    server = peers.Server(
        "fake", [sys.executable, "-c", SERVER, str(port)], {}, tmp_path / "fake.log"
    )
    with peers.running(server, port) as live:
        assert httpx.get(f"{live.url}/v1/models").status_code == 200 and live.model == "fake"
        assert len(peers.group_members(live.pgid)) == 2  # the server and its worker
    assert peers.group_members(live.pgid) == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{live.url}/v1/models", timeout=1)


@pytest.mark.slow  # runs a benchmark end to end
def test_a_server_that_dies_at_start_is_an_error(tmp_path: Path) -> None:
    server = peers.Server(
        "broken", [sys.executable, "-c", "raise SystemExit(3)"], {}, tmp_path / "broken.log"
    )
    with pytest.raises(RuntimeError, match="broken exited with 3 before it was ready"):
        with peers.running(server, peers.free_port()):
            pass


def test_stop_group_kills_what_ignores_term(monkeypatch) -> None:
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    monkeypatch.setattr(peers, "STOP_TIMEOUT_S", 1)
    peers.stop_group(proc)
    assert proc.returncode is not None and peers.group_members(proc.pid) == []


def _figures(tok_s: float, ttft: float, tpot: float) -> dict:
    return {
        "output_tok_s": tok_s,
        "completed": 4,
        "ttft_p50_ms": ttft,
        "ttft_p99_ms": ttft,
        "tpot_p50_ms": tpot,
        "tpot_p99_ms": tpot,
    }


def _result(runs: dict, **machine) -> dict:
    """A peers result of one round of ``runs`` on the default model (``machine``: the fields
    a run names its machine and vLLM's dtype by)."""
    return {
        "bench": "peers",
        "model": "SmolLM2-135M-Instruct",
        "peer": peers.VLLM_PIN,
        "rounds": 1,
        "input_len": 256,
        "output_len": 128,
        "cores": 2,
        **machine,
        "runs": runs,
    }


def test_compare_reports_the_median_round_and_the_goals() -> None:
    rounds = [
        {"chatpage": {"8": _figures(c, 100, 20)}, "vllm": {"8": _figures(100, 90, 30)}}
        for c in (120, 200, 160)
    ]
    run = peers.compare(rounds)["8"]
    assert run["ratios"] == [1.2, 2.0, 1.6]
    assert run["ratio"] == 1.6 and run["ratio_ok"]
    assert run["chatpage"]["output_tok_s"] == 160  # the figures of the median round
    assert not run["ttft_ok"] and run["tpot_ok"]


def test_the_report_shows_each_run_side_by_side_and_keeps_it_through_a_full_run(
    tmp_path: Path,
) -> None:
    from chatpage.bench import report

    figures = {
        "chatpage": {"1": _figures(60, 100, 15), "chats": _figures(90, 300, 40)},
        "vllm": {"1": _figures(30, 200, 32), "chats": _figures(100, 250, 35)},
    }
    result = _result(peers.compare([figures]))
    runs = {
        "peers": {"command": "chatpage bench peers --json", "seconds": 1800.0, "result": result}
    }
    text = report.render(runs, tmp_path / "b.md", "test machine", 1800.0)
    status = {
        line.split(" | ")[1]: line.split(" | ")[4]
        for line in text.splitlines()
        if line.startswith("| peers |")
    }
    assert status["chatpage / vLLM output tok/s, concurrency 1"] == "met"  # 2.0 >= 1.5
    assert status["TTFT p50 and TPOT p50 <= vLLM's, concurrency 1"] == "met"
    assert status["chatpage / vLLM output tok/s, 8 chats, one shared system prompt"] == "**missed**"
    assert status["TTFT p50 and TPOT p50 <= vLLM's, 8 chats, one shared system prompt"] == (
        "**missed**"
    )
    assert "| concurrency 1 | vllm | 30 | 200 | 200 | 32 | 32 | 4 |  |" in text
    back, _ = report.read_back(text)
    assert back["peers"]["result"] == json.loads(json.dumps(result))
    # a full `make bench` runs every benchmark but this one, and keeps its last figures
    assert "peers" not in report.to_run(None, False) and "single" in report.to_run(None, False)
    assert report.kept(back, None) == back and report.to_run("peers", False) == ["peers"]
    assert report.kept({"single": {}}, None) == {}


# /proc/cpuinfo of the two kinds of machine the peers report names (their first lines)
AVX2_CPUINFO = """processor	: 0
model name	: AMD EPYC 7B12
flags		: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
processor	: 1
model name	: AMD EPYC 7B12
flags		: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2
"""
AVX512_CPUINFO = """processor	: 0
model name	: Intel(R) Xeon(R) Platinum 8581C CPU @ 2.10GHz
flags		: fpu avx2 fma avx512f avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni amx_bf16 amx_tile
"""


@pytest.mark.parametrize(
    ("cpuinfo", "cpu", "extensions"),
    [
        (AVX2_CPUINFO, "AMD EPYC 7B12", ["AVX2"]),
        (
            AVX512_CPUINFO,
            "Intel(R) Xeon(R) Platinum 8581C CPU @ 2.10GHz",
            ["AVX2", "AVX-512", "VNNI", "BF16", "AMX"],
        ),
        ("", "unknown CPU", []),
    ],
    ids=["avx2", "avx512", "none"],
)
def test_the_machine_is_named_by_its_cpu_and_vector_extensions(cpuinfo, cpu, extensions) -> None:
    assert peers.cpu_facts(cpuinfo) == {"cpu": cpu, "extensions": extensions}


def test_vllm_runs_in_its_faster_dtype_measured_once_per_machine(tmp_path: Path) -> None:
    """Each machine measures both dtypes once and keeps the faster; a second run on the same
    machine reads the choice, another machine measures its own."""
    speeds = {  # vLLM's output tok/s: fp32 wins without AVX-512 BF16, bf16 with it
        "AMD EPYC 7B12": {"bfloat16": 27.4, "float32": 80.6},
        "Intel(R) Xeon(R) Platinum 8581C CPU @ 2.10GHz": {"bfloat16": 201.0, "float32": 150.0},
    }
    asked: list[tuple[str, str]] = []

    def on(facts: dict):
        def measure(dtype: str) -> float:
            asked.append((facts["cpu"], dtype))
            return speeds[facts["cpu"]][dtype]

        return measure

    avx2, avx512 = peers.cpu_facts(AVX2_CPUINFO), peers.cpu_facts(AVX512_CPUINFO)
    first = peers.best_dtype(tmp_path, avx2, on(avx2))
    assert first == {
        "dtype": "float32",
        "output_tok_s": {"bfloat16": 27.4, "float32": 80.6},
        "concurrency": peers.PROBE_CONCURRENCY,
    }
    assert peers.best_dtype(tmp_path, avx2, on(avx2)) == first
    assert peers.best_dtype(tmp_path, avx512, on(avx512))["dtype"] == "bfloat16"
    assert asked == [(m, d) for m in speeds for d in peers.DTYPES]  # each machine once
    recorded = json.loads((tmp_path / peers.DTYPE_FILE).read_text())
    assert set(recorded) == {"AMD EPYC 7B12 (AVX2)", peers.machine_key(avx512)}


@pytest.mark.parametrize("cpuinfo", [AVX2_CPUINFO, AVX512_CPUINFO], ids=["avx2", "avx512"])
def test_the_report_names_the_cpu_the_dtype_and_the_other_machine(cpuinfo: str) -> None:
    from chatpage.bench.reporting import from_json

    facts = peers.cpu_facts(cpuinfo)
    figures = {"chatpage": {"8": _figures(160, 100, 20)}, "vllm": {"8": _figures(80, 90, 30)}}
    result = _result(
        peers.compare([figures], peers.GOAL_RATIO_DEFAULT),
        **facts,
        vllm_dtype="float32",
        dtype_probe={"bfloat16": 27.4, "float32": 80.6},
        load_avg={"vllm": 7.8, "chatpage": 14.9},
    )
    text = "\n".join(peers.figures(from_json(peers.PeersResult, result)))
    assert "in float32 (its faster dtype on this CPU: output tok/s at concurrency 8 " in text
    assert "bfloat16 27.4, float32 80.6" in text
    assert f"CPU: {facts['cpu']}, vector extensions {', '.join(facts['extensions'])}." in text
    assert (
        "Load average (1 min) as each server's runs ended: vllm 7.8, chatpage 14.9: more than "
        "its 2 cores, so these figures say more about the other work than about either server."
    ) in text
    other = "AVX-512 (VNNI, BF16)" if cpuinfo is AVX2_CPUINFO else "AVX2-only"
    assert "Another kind of machine, not measured in this run: " in text and other in text
    goal = peers.goals(from_json(peers.PeersResult, result))[0]
    assert goal.target == ">= 2.0" and goal.met  # 2.0x vLLM on the default model


def test_the_0_5b_shape_is_a_section_of_its_own_with_its_own_goal() -> None:
    from chatpage.bench import report
    from chatpage.bench.reporting import from_json

    figures = {"chatpage": {"8": _figures(120, 100, 20)}, "vllm": {"8": _figures(80, 90, 30)}}
    result = _result(peers.compare([figures]), **peers.cpu_facts(AVX512_CPUINFO))
    result["model"] = "Qwen2.5-0.5B-shaped.F16"
    goal = peers.goals(from_json(peers.PeersResult, result))[0]
    assert goal.bench == "peers, Qwen2.5-0.5B-shaped.F16"
    assert goal.target == ">= 1.5" and goal.met  # 1.5x there
    assert report.to_run("peers_qwen05", False) == ["peers_qwen05"]
    assert "peers_qwen05" not in report.to_run(None, False)
    assert report.command("peers_qwen05", Path("."), [])[3:] == [
        "bench",
        "peers",
        "--json",
        "--rounds",
        "3",
        "--model",
        "qwen05",
    ]


def test_a_run_with_int8_kv_names_it_and_is_a_section_of_its_own(tmp_path) -> None:
    """``--kv-cache-dtype int8`` reaches `chatpage serve`'s command line, and the report names
    it in the figures and the goals (the section runs only when named)."""
    from chatpage.bench import report
    from chatpage.bench.reporting import from_json

    server = peers.chatpage_server(None, 8000, tmp_path / "log", "int8")
    assert server.command[-2:] == ["--kv-cache-dtype", "int8"]
    assert "--kv-cache-dtype" not in peers.chatpage_server(None, 8000, tmp_path / "l", None).command
    figures = {"chatpage": {"8": _figures(120, 100, 20)}, "vllm": {"8": _figures(80, 90, 30)}}
    result = _result(peers.compare([figures]), **peers.cpu_facts(AVX512_CPUINFO))
    parsed = from_json(peers.PeersResult, {**result, "kv_cache_dtype": "int8"})
    assert peers.goals(parsed)[0].bench == "peers, int8 KV"
    assert "`--kv-cache-dtype int8`" in peers.figures(parsed)[0]
    assert "no flags" in peers.figures(from_json(peers.PeersResult, result))[0]
    assert report.to_run("peers_int8_kv", False) == ["peers_int8_kv"]
    assert "peers_int8_kv" not in report.to_run(None, False)
    assert report.command("peers_int8_kv", Path("."), [])[3:] == [
        "bench",
        "peers",
        "--json",
        "--rounds",
        "3",
        "--kv-cache-dtype",
        "int8",
    ]


@pytest.mark.slow  # two real `chatpage serve` processes, one after the other
def test_the_tier_mode_compares_chatpage_writing_its_tier_with_it_off(
    tiny_llama_dir: Path, tmp_path: Path, capsys
) -> None:
    argv = ["--tier", "--json", "--model", str(tiny_llama_dir), "--scale", "0.1"]
    assert peers.main([*argv, "--peers-dir", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "tier" and set(result["runs"]) == {"chats", "samples", "distinct"}
    for run in result["runs"].values():
        assert run["off_tok_s"][0] > 0 and run["writing_tok_s"][0] > 0
        ratio = run["writing_tok_s"][0] / run["off_tok_s"][0]
        assert run["tier_ratio"] == pytest.approx(ratio, abs=1e-3)
    log = (tmp_path / "logs" / "chatpage.log").read_text()
    assert "Traceback" not in log
    read = peers.SECTION_TIER.read(result)
    goals = peers.tier_goals(read)
    assert len(goals) == 3 and all(g.target == ">= 0.97" for g in goals)
    assert "| median ratio |" in "\n".join(peers.tier_figures(read))
