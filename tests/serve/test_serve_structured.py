"""Structured outputs, tool calls and thinking through a real `chatpage serve`, driven by the
official `openai` SDK: a tiny random model (with a chat template that declares thinking) for the
wire cases, the real default model where the grammar has to make a small model's answer valid."""

from __future__ import annotations

import json
import shutil

import httpx
import jsonschema
import openai
import pytest
from serve_helpers import running_server

pytestmark = pytest.mark.slow  # a chatpage serve of its own (a subprocess)

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "temperature": {"type": "integer", "minimum": -50, "maximum": 60},
        "sky": {"enum": ["clear", "cloudy", "rain"]},
    },
    "required": ["city", "temperature", "sky"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 24},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two whole numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 1000},
                "b": {"type": "integer", "minimum": 0, "maximum": 1000},
            },
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
THINKING_TEMPLATE = (  # ChatML that keeps only the answer of earlier replies (Qwen3's habit)
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{{ message['content'].split('</think>')[-1] }}"
    "{% else %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    "{# replies think first, inside <think></think> #}"
)


class Server:
    """A running server: its URL and an SDK client that names its model."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        self.model = self.client.models.list().data[0].id

    def chat(self, **kw):
        return self.client.chat.completions.create(model=self.model, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("thinking") / "llama"
    shutil.copytree(tiny_llama_dir, model)
    (model / "chat_template.jinja").write_text(THINKING_TEMPLATE)
    with running_server(model, tmp_path_factory.mktemp("serve")) as url:
        yield Server(url)


@pytest.fixture(scope="module")
def smol(default_model_dir, tmp_path_factory):
    with running_server(
        default_model_dir, tmp_path_factory.mktemp("serve"), kv_cache="192MiB"
    ) as url:
        yield Server(url)


def _schema_format() -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True},
    }


@pytest.mark.parametrize(
    "extra",
    [
        {"n": 3, "temperature": 0.9, "seed": 1},
        {"n": 2, "temperature": 0, "extra_body": {"use_beam_search": True}},
    ],
    ids=["n3", "beam2"],
)
def test_json_schema_answers_validate(smol, extra):
    out = smol.chat(messages=ASK, max_tokens=80, response_format=_schema_format(), **extra)
    assert len(out.choices) == extra["n"]
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def _validate_calls(message, tools) -> None:
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    assert message.tool_calls
    for call in message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


def test_required_and_named_tool_calls_validate(smol):
    out = smol.chat(
        messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_tokens=120, temperature=0
    )
    assert out.choices[0].finish_reason == "tool_calls"
    _validate_calls(out.choices[0].message, [WEATHER, ADD])
    named = smol.chat(
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=[WEATHER, ADD],
        tool_choice={"type": "function", "function": {"name": "add"}},
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    message = named.choices[0].message
    _validate_calls(message, [ADD])
    assert [c.function.name for c in message.tool_calls] == ["add"]


def test_streamed_tool_calls_reassemble_to_the_whole_answer(smol):
    kw = dict(
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=60,
        temperature=0,
    )
    whole = smol.chat(**kw).choices[0]
    calls: dict[int, dict] = {}
    pieces: dict[int, int] = {}
    reasons = []
    for chunk in smol.chat(stream=True, **kw):
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            assert not choice.delta.content  # the call is not content
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += d.function.name or ""
                call["arguments"] += d.function.arguments or ""
                pieces[d.index] = pieces.get(d.index, 0) + 1
    assert [calls[i] for i in sorted(calls)] == [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls
    ]
    assert all(n > 3 for n in pieces.values())  # the arguments stream as the JSON grows
    assert reasons[-1] == whole.finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "extra",
    [{"temperature": 0.8, "seed": 3}, {"temperature": 0, "extra_body": {"use_beam_search": True}}],
    ids=["n2", "beam2"],
)
def test_forked_samples_and_beams_each_read_their_own_calls(smol, extra):
    out = smol.chat(
        messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_tokens=80, n=2, **extra
    )
    assert len(out.choices) == 2
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        _validate_calls(choice.message, [WEATHER, ADD])


def test_a_tool_conversation_is_accepted_in_the_history(smol):
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    out = smol.chat(messages=history, tools=[WEATHER], max_tokens=16, temperature=0)
    assert out.choices[0].message.content or out.choices[0].message.tool_calls


def test_vllm_structured_outputs(tiny):
    api = tiny
    choice = api.chat(
        messages=ASK,
        max_tokens=10,
        temperature=1.0,
        seed=2,
        n=3,
        extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
    )
    assert {c.message.content for c in choice.choices} <= {"yes", "no", "maybe"}
    regex = api.chat(
        messages=ASK,
        max_tokens=20,
        temperature=0,
        extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}},
    )
    assert regex.choices[0].message.content[:3].isdigit()
    obj = api.chat(
        messages=ASK, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    if obj.choices[0].finish_reason == "stop":  # a random model may run out of tokens first
        assert isinstance(json.loads(obj.choices[0].message.content), dict)
    else:
        assert obj.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                }
            },
            "response_format.json_schema.schema",
        ),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"structured_outputs": {"regex": "a(b"}}, "unclosed group"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"a": {"type": 5}}},
                        },
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "nope",
        ),
        ({"tool_choice": "required"}, "needs tools"),
        ({"frobnicate": 1}, "unknown field 'frobnicate'"),
        ({"frequency_penalty": 0.5}, "frequency_penalty is not implemented"),
        ({"logit_bias": {"5": 500}}, "logit_bias"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "tool_call_id"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(tiny, body, words):
    reply = httpx.post(
        f"{tiny.url}/v1/chat/completions",
        timeout=60,
        json={"messages": ASK, "max_tokens": 4, **body},
    )
    assert reply.status_code == 400, reply.text
    assert words in reply.json()["error"]["message"]


def test_neutral_values_of_unimplemented_fields_are_taken(tiny):
    api = tiny
    out = api.chat(messages=ASK, max_tokens=2, frequency_penalty=0, presence_penalty=0, user="me")
    assert out.choices[0].message.content is not None


def test_logit_bias_forces_a_token(tiny):
    api = tiny
    out = api.chat(
        messages=ASK,
        max_tokens=3,
        temperature=0,
        logit_bias={"42": 100},
        logprobs=True,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True},
    )
    assert [t.token for t in out.choices[0].logprobs.content] == ["token_id:42"] * 3


def test_thinking_comes_apart_as_reasoning_content_whole_and_streamed(tiny):
    api = tiny
    kw = dict(
        messages=ASK,
        max_tokens=40,
        temperature=0,
        extra_body={
            "structured_outputs": {
                "regex": "<think>[a-z]{2,8}( [a-z]{2,8}){0,2}</think>\n\n[A-Z][a-z]{2,8}\\."
            }
        },
    )
    whole = api.chat(**kw).choices[0].message
    thought = whole.model_extra["reasoning_content"]
    assert thought and "<think>" not in thought and "</think>" not in whole.content
    assert whole.content[0].isupper() and whole.content.endswith(".")
    reasoning, content = "", ""
    for chunk in api.chat(stream=True, **kw):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (thought, whole.content)
