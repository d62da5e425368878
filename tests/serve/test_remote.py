"""`--backend URL`: RemoteEngineClient, `ask --backend` and the TUI against a real `chatpage serve`
(its own server is an OpenAI-compatible backend), and against llama-server when installed."""

from __future__ import annotations

import importlib.util
import io
import queue
import sys
import time

import httpx
import pytest
from serve_helpers import free_port, llama_server, running_server

from chatpage.cli.main import main
from chatpage.config.settings import Settings, load_settings
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.client import ChatRequest, FinishReason, RequestUpdate, StatusKind
from chatpage.engine.outputs import RequestOutput
from chatpage.engine.sampling_params import SamplingParams
from chatpage.remote.backend import Backend
from chatpage.remote.client import RemoteEngineClient
from chatpage.remote.requests import RemoteReply, split_samples
from chatpage.remote.stats import Poller, RemoteStats
from chatpage.ui.app import ChatApp
from chatpage.wire.chunks import read_choice
from chatpage.wire.requests import request_body

HI = [{"role": "user", "content": "Say something."}]


@pytest.fixture
def client(url):
    c = RemoteEngineClient(url)
    c.start()
    assert c.wait_ready(30), c.status
    yield c
    c.close()


def collect(
    client, messages, params: SamplingParams, timeout: float = 60, **how
) -> tuple[list[RequestUpdate], RequestOutput]:
    """Every update of one reply, and the outputs they fold into."""
    updates: queue.SimpleQueue = queue.SimpleQueue()
    client.submit(ChatRequest(messages, params, **how), updates.put)
    return drain(updates, timeout)


def drain(
    updates: queue.SimpleQueue, timeout: float = 60
) -> tuple[list[RequestUpdate], RequestOutput]:
    got: list[RequestUpdate] = []
    outputs = OutputAccumulator()
    while not got or not got[-1].finished:
        got.append(updates.get(timeout=timeout))
        out = outputs.add(got[-1])
    return got, out


def server_stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/chatpage/stats").json()


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_probe_finds_chatpage_and_its_capabilities(client, url):
    backend = client.backend
    assert backend.name == "chatpage" and backend.model == "llama"
    assert {"beam", "n", "metrics", "stats", "vllm_extras"} <= backend.capabilities
    assert client.max_model_len == 1024 and client.model_name == "llama on chatpage"
    assert client.warnings == []


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_reply_streams_with_usage(client):
    updates, final = collect(
        client, HI, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    )
    assert len([u for u in updates if u.outputs and u.outputs[0].text]) == 8
    (output,) = final.outputs
    assert output.finish_reason is FinishReason.LENGTH and output.num_tokens == 8
    assert output.text == "".join(d.text for u in updates for d in u.outputs)
    assert final.usage.prompt_tokens > 0 and final.ttft_s is not None


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_samples_and_beams(client):
    _, out = collect(client, HI, SamplingParams(n=3, max_tokens=5, temperature=1.0, seed=4))
    texts = {c.index: c.text for c in out.outputs if c.finish_reason is not None}
    assert sorted(texts) == [0, 1, 2] and len(set(texts.values())) > 1
    _, out = collect(client, HI, SamplingParams(beam_width=2, max_tokens=5))
    beams = {c.index: c.text for c in out.outputs if c.finish_reason is not None and c.text}
    assert sorted(beams) == [0, 1] and beams[0] != beams[1]


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_logprobs_pass_through_by_token_id(client, tiny_llama_dir):
    from transformers import AutoTokenizer

    final = collect(
        client, HI, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=3)
    )[1].outputs[0]
    assert final.num_tokens == len(final.token_ids) == len(final.logprobs) == 6
    assert AutoTokenizer.from_pretrained(tiny_llama_dir).decode(final.token_ids) == final.text
    for tok, lp, top in zip(final.token_ids, final.logprobs, final.top_logprobs, strict=True):
        # greedy: the sampled token is (one of, in a tie) the best of its step's 3
        assert len(top) == 3 and top.get(tok, lp) == lp == max(top.values())
    events: queue.SimpleQueue = queue.SimpleQueue()
    client.submit_prompt(
        "Hello there",
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=2),
        events.put,
    )
    final = drain(events)[1].outputs[0]
    assert len(final.token_ids) == 4 and [len(top) for top in final.top_logprobs] == [2] * 4
    assert [max(top.values()) for top in final.top_logprobs] == final.logprobs  # greedy
    plain = collect(client, HI, SamplingParams(max_tokens=3, temperature=0))[1].outputs[0]
    assert plain.logprobs is None and plain.top_logprobs is None


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_cancel_closes_the_stream_and_frees_the_server_blocks(client, url):
    events: queue.SimpleQueue = queue.SimpleQueue()
    rid = client.submit(
        ChatRequest(HI, SamplingParams(max_tokens=900, ignore_eos=True)), events.put
    )
    while events.get(timeout=30).usage.completion_tokens < 3:
        pass
    client.cancel(rid)
    while not (update := events.get(timeout=30)).finished:
        pass
    assert [d.finish_reason for d in update.outputs] == [FinishReason.ABORT]
    deadline = time.monotonic() + 30
    while (s := server_stats(url))["num_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert s["num_running"] == 0 and s["blocks_private"] == 0


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_a_reply_continues_where_it_stopped(client):
    _, first = collect(client, HI, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    _, final = collect(
        client,
        HI + [{"role": "assistant", "content": first.outputs[0].text}],
        SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
        continue_reply=True,
    )
    assert final.error is None and final.outputs[0].num_tokens == 4
    # the reply's own tokens are part of the prompt (no new turn was opened for it)
    assert final.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_http_errors_carry_the_servers_message(client):
    long = [{"role": "user", "content": "word " * 1200}]
    final = collect(client, long, SamplingParams(max_tokens=4))[1]
    assert final.outputs[0].finish_reason is FinishReason.ERROR
    assert final.error.startswith("chatpage answered 400:") and "context window" in final.error


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_a_server_without_the_api_is_an_error_not_a_retry(url):
    client = RemoteEngineClient(f"{url}/not-here")
    client.start()
    try:
        assert not client.wait_ready(10)
        assert "answered 404" in client.error and client.status.kind is StatusKind.ERROR
        final = collect(client, HI, SamplingParams(max_tokens=2))[1]
        assert final.outputs[0].finish_reason is FinishReason.ERROR
        assert final.error == client.error
    finally:
        client.close()


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_stats_are_polled_from_metrics_and_the_pool(client, url):
    deadline = time.monotonic() + 10
    while (stats := client.stats()) is None or stats.engine is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert isinstance(stats, RemoteStats) and stats.reachable
    assert stats.backend == f"chatpage at {url}"
    assert stats.engine.blocks_pinned == server_stats(url)["blocks_pinned"] > 0
    assert 0 < stats.kv_usage <= 1 and stats.num_running is not None


@pytest.mark.slow  # waits out a server's retries and deadlines
def test_unreachable_server_is_retried_and_held_requests_then_run(tiny_llama_dir, tmp_path):
    port = free_port()
    client = RemoteEngineClient(f"http://127.0.0.1:{port}")
    client.start()
    try:
        deadline = time.monotonic() + 10
        while not client.status.text.startswith("cannot reach"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not client.ready and client.error is None
        events: queue.SimpleQueue = queue.SimpleQueue()
        client.submit(ChatRequest(HI, SamplingParams(max_tokens=3)), events.put)  # held, not lost
        with running_server(tiny_llama_dir, tmp_path, port=port):
            (output,) = drain(events)[1].outputs
            assert client.ready and output.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            assert output.text
    finally:
        client.close()


def test_bodies_name_every_field_per_backend():
    params = SamplingParams(n=3, temperature=0.7, top_p=0.9, max_tokens=9, seed=5)
    llama = Backend("http://x", "llamacpp", "m", 0, capabilities={"metrics"})
    vllm = Backend("http://x", "vllm", "m", 0, capabilities={"n", "beam", "vllm_extras"})
    body = request_body("m", "chat", HI, params, vllm.dialect)
    assert body["top_k"] == -1 and body["n"] == 3 and body["seed"] == 5
    assert {"temperature", "top_p", "max_tokens", "stop", "stop_token_ids"} <= set(body)
    assert request_body("m", "chat", HI, params, llama.dialect)["top_k"] == 0
    assert "stop_token_ids" not in request_body("m", "chat", HI, params, llama.dialect)
    parts = split_samples(llama, params)
    assert [(p.n, p.seed) for p in parts] == [(1, 5), (1, 6), (1, 7)]
    assert split_samples(vllm, params) == [params]
    notes = " ".join(llama.notes())
    assert "no beam search" in notes and "seed+i" in notes
    sglang = Backend("http://x", "sglang", "m", 0, capabilities={"n", "vllm_extras"})
    assert any("--enable-metrics" in n for n in sglang.notes())
    beam = request_body("m", "chat", HI, SamplingParams(beam_width=2, max_tokens=4), vllm.dialect)
    assert beam["use_beam_search"] and beam["n"] == 2 and not beam["stream"]
    asking = SamplingParams(logprobs=2)
    assert request_body("m", "completion", "x", asking, vllm.dialect)["logprobs"] == 2
    chat = request_body("m", "chat", HI, asking, llama.dialect)
    assert chat["logprobs"] is True and chat["top_logprobs"] == 2
    assert "return_tokens_as_token_ids" not in chat  # llama-server names tokens by text only


def test_logprobs_named_by_text_keep_the_values_only():
    """A server without token ids: the sampled tokens' logprobs pass, alternatives cannot."""
    raw = {
        "tokens": ["Hi", "!"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hi": -0.5, "Ho": -1.5, "He": -2.0}, {"?": -0.1, "!": -1.0}],
    }
    delta = read_choice(
        {"index": 0, "text": "Hi!", "logprobs": raw, "finish_reason": "stop"}, False, 1
    )
    assert delta.token_ids == () and delta.logprobs == (-0.5, -1.0)
    assert delta.top_logprobs is None
    updates: list[RequestUpdate] = []
    reply = RemoteReply("r", updates.append, time.monotonic())
    reply.add(delta)
    ((out,),) = [u.outputs for u in updates]
    assert out.logprobs == (-0.5, -1.0) and out.num_tokens == 2
    assert out.token_ids == () and out.top_logprobs is None
    assert out.finish_reason is FinishReason.STOP
    by_id = {
        "content": [
            {
                "token": "token_id:7",
                "logprob": -0.2,
                "top_logprobs": [
                    {"token": "token_id:7", "logprob": -0.2},
                    {"token": "token_id:9", "logprob": -1.9},
                ],
            }
        ]
    }
    delta = read_choice({"index": 0, "delta": {"content": "x"}, "logprobs": by_id}, True, 2)
    assert delta.token_ids == (7,) and delta.top_logprobs == ({7: -0.2, 9: -1.9},)


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_poller_reads_vllm_sglang_and_llamacpp_names(url):
    text = httpx.get(f"{url}/metrics").text  # chatpage serve speaks vLLM's names
    stats = Poller().stats("chatpage", text, 0.0, None, ())
    assert stats.kv_usage is not None and stats.num_waiting == 0
    old_vllm = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.25\n"
    assert Poller().stats("vLLM", old_vllm, 0.0, None, ()).kv_usage == 0.25
    sglang = (
        "# TYPE sglang:token_usage gauge\nsglang:token_usage 0.5\n"
        "# TYPE sglang:cache_hit_rate gauge\nsglang:cache_hit_rate 0.75\n"
        "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 4\n"
    )
    s = Poller().stats("SGLang", sglang, 0.0, None, ())
    assert (s.kv_usage, s.prefix_hit_rate, s.num_running) == (0.5, 0.75, 4)
    assert s.preemptions is None  # SGLang does not say: the gauge shows a dash


def test_backend_setting_and_flag(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("backend: http://gpu:8000/\n")
    assert load_settings(path)[0].backend == "http://gpu:8000"
    path.write_text("backend: gpu:8000\n")
    settings, warnings = load_settings(path)
    assert settings.backend is None and "backend" in warnings[0] and "http://" in warnings[0]
    assert load_settings(path, {"backend": "https://h"})[0].backend == "https://h"


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
def test_ask_backend_answers_from_the_server(url, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main(["ask", "--backend", url, "--max-tokens", "6", "hello"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["ask", "--backend", url, "--max-tokens", "4", "--beam", "2", "hello"]) == 0
    out = capsys.readouterr().out
    assert "--- beam 1" in out and "--- beam 2" in out
    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setattr("chatpage.cli.ask.CONNECT_S", 1.0)
    assert main(["ask", "--backend", dead, "hello"]) == 1
    assert f"cannot reach {dead}" in capsys.readouterr().err


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
async def test_tui_over_chatpage_serve_with_its_gauge(url):
    app = ChatApp(settings=Settings(), client=RemoteEngineClient(url))

    async def until(condition, what: str) -> None:
        deadline = time.monotonic() + 30
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await pilot.pause(0.05)

    async with app.run_test(size=(150, 48)) as pilot:
        session = app.chat.current
        await until(lambda: app.client.ready, "the backend")
        await app.chat.submit_prompt("/max 12")
        await app.chat.submit_prompt("hello over http")
        await until(lambda: session.entries[-1].status == "done", "the reply")
        assert session.entries[-1].content and session.entries[-1].stats.tokens > 0
        gauge = app.chat.gauge
        await until(
            lambda: isinstance(gauge.stats, RemoteStats) and gauge.stats.engine is not None,
            "the remote figures",
        )
        shown = gauge.render().plain
        pool = gauge.stats.engine
        assert f"chatpage at {url}" in shown and "KV " in shown and "tok/s" in shown
        assert f"{pool.blocks_used}/{pool.num_blocks} blocks" in shown
        assert "llama on chatpage · ready" in gauge.status


@pytest.mark.peers
@pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python[server] is not installed (make test-peers installs it)",
)
def test_llama_server_as_a_backend(tmp_path):
    from chatpage.engine.load.loader import default_model_path

    with llama_server(default_model_path(), tmp_path) as url:
        client = RemoteEngineClient(url)
        client.start()
        try:
            assert client.wait_ready(60), client.status
            assert client.backend.name == "llama-cpp-python" and not client.backend.can("beam")
            (final,) = collect(client, HI, SamplingParams(max_tokens=6, temperature=0))[1].outputs
            assert final.text and final.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
            _, out = collect(client, HI, SamplingParams(n=2, max_tokens=4, seed=1))
            assert [c.index for c in out.outputs] == [0, 1]  # two requests, seeds 1 and 2
            refused = collect(client, HI, SamplingParams(beam_width=2, max_tokens=4))[1]
            assert refused.outputs[0].finish_reason is FinishReason.ERROR
            assert "no beam search" in refused.error
        finally:
            client.close()


@pytest.mark.slow  # a chatpage serve of its own (a subprocess)
async def test_tui_switches_from_the_local_model_to_a_backend(tiny_llama_dir, url):
    app = ChatApp(model=str(tiny_llama_dir), settings=Settings(backend=url))
    async with app.run_test(size=(150, 48)) as pilot:
        deadline = time.monotonic() + 60
        while not app.client.ready:
            assert time.monotonic() < deadline, "the local model"
            await pilot.pause(0.05)
        app.models.switch(url)
        while not (isinstance(app.client, RemoteEngineClient) and app.client.ready):
            assert time.monotonic() < deadline, "the backend"
            await pilot.pause(0.05)
        session = app.chat.current
        await app.chat.submit_prompt("/max 6")
        await app.chat.submit_prompt("hello after the switch")
        while session.entries[-1].status != "done":
            assert time.monotonic() < deadline, "the reply from the backend"
            await pilot.pause(0.05)
        assert session.entries[-1].content
        gauge = app.chat.gauge
        while not isinstance(gauge.stats, RemoteStats):
            assert time.monotonic() < deadline, "the backend's figures"
            await pilot.pause(0.05)
        assert f"chatpage at {url}" in gauge.render().plain


async def test_tui_says_an_unreachable_backend_and_keeps_the_message():
    dead = f"http://127.0.0.1:{free_port()}"
    app = ChatApp(settings=Settings(), client=RemoteEngineClient(dead))
    async with app.run_test(size=(150, 48)) as pilot:
        gauge = app.chat.gauge
        deadline = time.monotonic() + 10
        while "cannot reach" not in gauge.status:
            assert time.monotonic() < deadline
            await pilot.pause(0.05)
        assert dead in gauge.status and "retrying" in gauge.status
        session = app.chat.current
        await app.chat.submit_prompt("still there?")
        await pilot.pause(0.3)
        assert session.streaming  # waiting for the server, not failed
        assert session.entries[-2].content == "still there?"
