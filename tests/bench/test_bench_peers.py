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
    result = {
        "bench": "peers",
        "model": "SmolLM2-135M-Instruct",
        "peer": peers.VLLM_PIN,
        "rounds": 1,
        "input_len": 256,
        "output_len": 128,
        "cores": 2,
        "runs": peers.compare([figures]),
    }
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
