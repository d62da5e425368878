"""Speculative decoding through `chatpage serve`, as a client meets it: two real servers on the
tiny random Llama (int4: the weights whose kernels compute every row alike, so the engine
drafts), one with --speculate auto and one with --speculate off, asked the same by the `openai`
package. Greedy answers are the same (a JSON schema's too, whose forced tokens are drafted), and
the first server's /metrics counts the drafts it kept under vLLM's spec-decode names. No disk
tier: each server prefills the prompt cold."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from grammar_specs import SCHEMA
from serve_helpers import metrics, running_server, wait_idle

pytestmark = pytest.mark.slow  # two chatpage serves of their own (subprocesses)

# (the tiny model's greedy answer to it repeats itself: its own output is the draft)
QUESTIONS = ["tell me about paging " * 3, "Say something. " * 4]


def answers_and_metrics(model_dir, home, mode: str) -> tuple[list[str], dict[str, float]]:
    home.mkdir()
    flags = ["--weights", "int4", "--kv-disk", "0", "--speculate", mode]
    with running_server(model_dir, home, extra=flags) as url:
        wait_idle(url)  # (the personas' prefills batched with a question would change its bits)
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        texts = []
        for question in QUESTIONS:
            reply = api.chat.completions.create(
                model="llama",
                messages=[{"role": "user", "content": question}],
                max_tokens=40,
                temperature=0,
            )
            texts.append(reply.choices[0].message.content or "")
        value = metrics(url)
        # a JSON schema's answer: the tokens its grammar forces are drafted
        reply = api.chat.completions.create(
            model="llama",
            messages=[{"role": "user", "content": "A color, please."}],
            max_tokens=60,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
        )
        texts.append(reply.choices[0].message.content or "")
        after = metrics(url)
        value["structured_accepted"] = (
            after["vllm:spec_decode_num_accepted_tokens"]
            - value["vllm:spec_decode_num_accepted_tokens"]
        )
    return texts, value


def test_greedy_answers_match_and_metrics_count_the_accepted_drafts(tiny_llama_dir, tmp_path):
    on, on_metrics = answers_and_metrics(tiny_llama_dir, tmp_path / "on", "auto")
    off, off_metrics = answers_and_metrics(tiny_llama_dir, tmp_path / "off", "off")
    assert on == off and all(on)
    jsonschema.validate(json.loads(on[-1]), SCHEMA)
    assert on_metrics["structured_accepted"] > 0 == off_metrics["structured_accepted"]
    drafted = on_metrics["vllm:spec_decode_num_draft_tokens"]
    accepted = on_metrics["vllm:spec_decode_num_accepted_tokens"]
    assert 0 < accepted <= drafted and on_metrics["vllm:spec_decode_num_drafts"] > 0
    assert off_metrics["vllm:spec_decode_num_draft_tokens"] == 0
    assert on_metrics["vllm:generation_tokens"] == off_metrics["vllm:generation_tokens"] == 80
