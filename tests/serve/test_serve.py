"""`chatpage serve` on a tiny model in a subprocess, driven by the `openai` package and httpx."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import running_server, wait_idle

from chatpage.engine.client import LocalEngineClient
from chatpage.serve import build_app
from chatpage.serve.threaded import serving

pytestmark = pytest.mark.slow  # a chatpage serve of its own (a subprocess)

KEY = "test-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
HI = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def url(tiny_llama_dir, tmp_path_factory):
    with running_server(tiny_llama_dir, tmp_path_factory.mktemp("serve"), api_key=KEY) as url:
        wait_idle(url)  # (the tests that ask twice compare answers: conftest's url)
        yield url


@pytest.fixture(scope="module")
def api(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY)


def post(url: str, path: str, body, **kw) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=HEADERS, timeout=60, **kw)


def stats(url: str) -> dict:
    return httpx.get(f"{url}/v1/chatpage/stats", headers=HEADERS).json()


def test_models_and_health(api, url):
    assert httpx.get(f"{url}/health").status_code == 200
    models = {m.id: m for m in api.models.list()}
    assert "llama" in models and "chatpage/coder" in models
    assert models["llama"].owned_by == "chatpage"
    assert models["llama"].model_extra["max_model_len"] == 1024


def test_chat_whole_and_streamed_agree(api):
    whole = api.chat.completions.create(model="llama", messages=HI, max_tokens=12, temperature=0)
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.prompt_tokens > 0
    chunks = list(
        api.chat.completions.create(
            model="llama",
            messages=HI,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finals[-1] == "length" and all(f is None for f in finals[:-1])
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 12
    # the same prompt again: its full blocks come from the prefix cache
    assert usage.prompt_tokens_details.cached_tokens >= 16


def test_continue_final_message_extends_the_last_reply(api, url):
    first = api.chat.completions.create(model="llama", messages=HI, max_tokens=4, temperature=0)
    partial = first.choices[0].message.content
    more = api.chat.completions.create(
        model="llama",
        messages=HI + [{"role": "assistant", "content": partial}],
        max_tokens=4,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert more.choices[0].message.content and more.usage.completion_tokens == 4
    assert more.usage.prompt_tokens > first.usage.prompt_tokens  # the reply is in the prompt
    r = post(url, "/v1/chat/completions", {"messages": HI, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"


def test_chat_logprobs_per_token(api):
    r = api.chat.completions.create(
        model="llama", messages=HI, max_tokens=5, temperature=0, logprobs=True
    )
    content = r.choices[0].logprobs.content
    assert len(content) == 5 and all(t.logprob <= 0 for t in content)
    assert "".join(t.token for t in content) == r.choices[0].message.content


def test_chat_top_logprobs_whole_and_streamed(api):
    kw = dict(
        model="llama", messages=HI, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = api.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(content) == 6
    for t in content:
        assert len(t.top_logprobs) == 3 and t.bytes == list(t.token.encode())
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        # greedy: the sampled token is the most likely one (or tied with it)
        assert t.top_logprobs[0].logprob == t.logprob
    streamed = [
        e
        for c in api.chat.completions.create(**kw, stream=True)
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob, [a.token for a in e.top_logprobs]) for e in streamed] == [
        (t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in content
    ]


def test_completions_logprobs_two_alternatives(api):
    kw = dict(model="llama", prompt="Hello there", max_tokens=5, temperature=0, logprobs=2)
    lp = api.completions.create(**kw).choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 5
    for tok, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        # the top 2, the sampled token among them (greedy: first): vLLM's up-to-N+1 dict
        assert len(top) == 2 and top[tok] == value == max(top.values())
    streamed = [c.choices[0].logprobs for c in api.completions.create(**kw, stream=True)]
    assert [t for s in streamed for t in s.top_logprobs] == lp.top_logprobs
    assert [o for s in streamed for o in s.text_offset] == lp.text_offset
    text = api.completions.create(**kw).choices[0].text
    assert lp.text_offset == [
        text.index(t, o) for t, o in zip(lp.tokens, lp.text_offset, strict=True)
    ]
    by_id = api.completions.create(**kw, extra_body={"return_tokens_as_token_ids": True})
    lp_ids = by_id.choices[0].logprobs
    assert all(t.startswith("token_id:") for t in lp_ids.tokens)
    assert lp_ids.text_offset == lp.text_offset and by_id.choices[0].text == text


def test_beam_search_answers_per_beam_logprobs(url):
    body = {
        "messages": HI,
        "max_tokens": 5,
        "n": 2,
        "use_beam_search": True,
        "logprobs": True,
        "top_logprobs": 2,
    }
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        content = choice["logprobs"]["content"]
        assert "".join(t["token"] for t in content) == choice["message"]["content"]
        assert all(len(t["top_logprobs"]) == 2 for t in content)


def test_n_samples_streamed_per_index(api):
    chunks = list(
        api.chat.completions.create(
            model="llama", messages=HI, max_tokens=6, n=3, temperature=1.0, seed=3, stream=True
        )
    )
    texts: dict[int, str] = {}
    finished = {}
    for c in chunks:
        (choice,) = c.choices  # one choice per chunk, keyed by index
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
    assert sorted(texts) == [0, 1, 2] and finished == {0: "length", 1: "length", 2: "length"}
    assert len(set(texts.values())) > 1
    whole = api.chat.completions.create(
        model="llama", messages=HI, max_tokens=6, n=3, temperature=1.0, seed=3
    )
    assert {c.index: c.message.content for c in whole.choices} == texts


def test_beam_search_answers_with_the_final_beams(url):
    body = {"messages": HI, "max_tokens": 6, "n": 3, "use_beam_search": True, "temperature": 0}
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    choices = r.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert len({c["message"]["content"] for c in choices}) == 3
    with httpx.stream(
        "POST",
        f"{url}/v1/chat/completions",
        json={**body, "stream": True},
        headers=HEADERS,
        timeout=60,
    ) as s:
        lines = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    streamed: dict[int, str] = {}
    for ln in lines[:-1]:
        for c in json.loads(ln[6:])["choices"]:
            streamed[c["index"]] = streamed.get(c["index"], "") + c["delta"].get("content", "")
    assert streamed == {c["index"]: c["message"]["content"] for c in choices}


def test_stop_string_ends_the_reply(api):
    free = api.completions.create(model="llama", prompt="The", max_tokens=10, temperature=0)
    text = free.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    cut = api.completions.create(
        model="llama", prompt="The", max_tokens=10, temperature=0, stop=[stop]
    )
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text and text.startswith(cut.choices[0].text)


def test_seed_reproduces_a_sample(api):
    def sample(seed: int) -> str:
        r = api.chat.completions.create(
            model="llama", messages=HI, max_tokens=10, temperature=1.0, seed=seed
        )
        return r.choices[0].message.content

    assert sample(11) == sample(11)
    assert sample(11) != sample(12)


def test_completions_text_and_token_ids(api, url):
    by_text = api.completions.create(
        model="llama", prompt="Hello there", max_tokens=5, temperature=0, logprobs=0
    )
    lp = by_text.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 5 == by_text.usage.completion_tokens
    assert "".join(lp.tokens) == by_text.choices[0].text
    ids = [100, 200, 300, 400]
    r = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 4, "temperature": 0})
    assert r.json()["usage"]["prompt_tokens"] == 4
    streamed = "".join(
        c.choices[0].text
        for c in api.completions.create(
            model="llama", prompt=ids, max_tokens=4, temperature=0, stream=True
        )
    )
    assert streamed == r.json()["choices"][0]["text"]


def test_persona_model_uses_its_pinned_prefix(api):
    r = api.chat.completions.create(model="chatpage/coder", messages=HI, max_tokens=2)
    assert r.model == "chatpage/coder"
    assert r.usage.prompt_tokens_details.cached_tokens >= 16


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"messages": HI, "top_p": 3}, "top_p", "> 0 and <= 1"),
        ({"messages": HI, "n": 0}, "n", ">= 1"),
        ({"messages": HI, "max_tokens": "ten"}, "max_tokens", "whole number"),
        ({"messages": HI, "max_completion_tokens": 0}, "max_completion_tokens", ">= 1"),
        ({"messages": HI, "temperature": -1}, "temperature", ">= 0"),
        ({"messages": HI, "stop": 5}, "stop", "string"),
        ({"messages": HI, "top_logprobs": 21, "logprobs": True}, "top_logprobs", "<= 20"),
        ({"messages": HI, "top_logprobs": -1, "logprobs": True}, "top_logprobs", ">= 0"),
        ({"messages": HI, "top_logprobs": True, "logprobs": True}, "top_logprobs", "integer"),
        ({"messages": HI, "top_logprobs": 2}, "top_logprobs", "logprobs: true"),
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            "text part",
        ),
        ({"messages": HI, "stream_options": {"include_usage": True}}, "stream_options", "stream"),
    ],
)
def test_invalid_values_are_400_naming_the_field(url, body, field, words):
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == field and err["message"].startswith(field) and words in err["message"]


@pytest.mark.parametrize(("value", "words"), [(21, "<= 20"), (True, "integer"), ("2", "whole")])
def test_completions_invalid_logprobs_is_400(url, value, words):
    r = post(url, "/v1/completions", {"prompt": "Hi", "logprobs": value})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "logprobs" and words in err["message"]


def test_bad_json_long_prompt_unknown_model_and_unknown_fields(url):
    r = httpx.post(f"{url}/v1/chat/completions", content=b"{nope", headers=HEADERS)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = post(url, "/v1/completions", {"prompt": [7] * 1100, "max_tokens": 4})
    assert r.status_code == 400
    assert "1100 tokens" in r.json()["error"]["message"] and "1024" in r.json()["error"]["message"]
    r = post(url, "/v1/chat/completions", {"model": "gpt-9", "messages": HI})
    assert r.status_code == 404 and "gpt-9" in r.json()["error"]["message"]
    r = post(url, "/v1/chat/completions", {"messages": HI, "max_tokens": 2, "frobnicate": 1})
    assert r.status_code == 400 and "frobnicate" in r.json()["error"]["message"]


def test_api_key_is_required_on_v1_only(url):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.get(f"{url}/v1/models", headers=headers)
        assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").models.list()
    assert httpx.get(f"{url}/metrics").status_code == 200


async def test_32_concurrent_streams_all_complete(url):
    async def one(client: httpx.AsyncClient, i: int) -> tuple[str, str]:
        body = {
            "messages": [{"role": "user", "content": f"Count to {i}."}],
            "max_tokens": 8,
            "ignore_eos": True,
            "stream": True,
        }
        text, last = "", ""
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            async for line in s.aiter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
                elif line:
                    last = line
        return text, last

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=120) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(32)))
    assert all(last == "data: [DONE]" and text for text, last in results)


def test_metrics_parse_with_vllm_names(api, url):
    api.chat.completions.create(model="llama", messages=HI, max_tokens=3)
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:generation_tokens",
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "chatpage:blocks_pinned",
        "chatpage:blocks_shared",
        "chatpage:blocks_private",
        "chatpage:blocks_cached",
        "chatpage:blocks_swapped",
        "chatpage:prefix_cache_hits_device",
        "chatpage:prefix_cache_hits_disk",
        "chatpage:kv_disk_writes",
        "chatpage:kv_disk_bytes",
    ):
        assert name in families, name
    value = {f.name: f.samples[0].value for f in families.values() if f.samples}
    assert value["vllm:generation_tokens"] >= 3
    drafted = value["vllm:spec_decode_num_draft_tokens"]
    assert value["vllm:spec_decode_num_accepted_tokens"] <= drafted
    assert 0 < value["vllm:kv_cache_usage_perc"] <= 1  # the pinned persona prefixes
    assert value["chatpage:blocks_pinned"] == stats(url)["blocks_pinned"] > 0


def test_health_is_503_while_loading_and_after_a_failed_load(tmp_path):
    client = LocalEngineClient(str(tmp_path / "no-such-model"))  # not started yet: "loading"
    try:
        with serving(build_app(client)) as server:
            base = server.url
            assert httpx.get(f"{base}/health").status_code == 503
            r = httpx.post(f"{base}/v1/chat/completions", json={"messages": HI})
            assert r.status_code == 503 and "still loading" in r.json()["error"]["message"]
            client.start()
            assert not client.wait_ready(30)
            r = httpx.get(f"{base}/health")
            assert r.status_code == 503 and "did not load" in r.json()["status"]
    finally:
        client.close()


def test_bench_serve_api_json(tiny_llama_dir, capsys):
    from chatpage.bench import serve as bench_serve

    assert (
        bench_serve.main(
            [
                "--api",
                "--json",
                "--model",
                str(tiny_llama_dir),
                "--scale",
                "0.05",
                "--concurrency",
                "4",
                "--output-tokens",
                "5",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["benchmark"] == "serve_api" and r["concurrency"] == 4 and r["clock"] == "cpu"
    for run in (r["in_process"], r["api"]):
        assert {"rate", "ttft_p50", "ttft_p99", "tpot_p50"} <= set(run) and run["rate"] > 0
        assert run["process_cpu_s"] > run["reader_cpu_s"] > 0
    assert r["output_tokens"] == 4 * 5 == r["api"]["streamed_tokens"]
    assert r["server_thread_ms"] > 0 and r["client_ms"] > 0 and r["goal_api_overhead_ms"] == 1.0
    assert isinstance(r["api_overhead_ms"], float)
