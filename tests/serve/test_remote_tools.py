"""`--backend URL` with structured outputs, tools and thinking: the fields go out in the request
body, and what the server streams back (tool-call deltas, ``reasoning_content`` or vLLM's newer
``reasoning``) comes in as `OutputDelta.tool_calls` and `OutputDelta.reasoning`. Against a real
`chatpage serve` on a free port, and against a small HTTP server written here that answers
as vLLM does."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest
from serve_helpers import connected

from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestOutput, RequestUpdate
from chatpage.engine.protocol import ChatRequest
from chatpage.engine.sampling_params import GrammarKind, SamplingParams, Structured
from chatpage.remote.client import RemoteEngineClient
from chatpage.vocab import FinishReason

pytestmark = pytest.mark.slow  # a chatpage serve of its own (a subprocess)

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["unit"],
            "additionalProperties": False,
        },
    },
}
ARGUMENTS = '{"city": "Paris", "unit": "celsius"}'


def collect(
    client: RemoteEngineClient, params: SamplingParams, **how
) -> tuple[list[RequestUpdate], RequestOutput]:
    updates: queue.SimpleQueue = queue.SimpleQueue()
    client.submit(ChatRequest(ASK, params, **how), updates.put)
    got: list[RequestUpdate] = []
    fold = OutputAccumulator()
    while not got or not got[-1].finished:
        got.append(updates.get(timeout=60))
        out = fold.add(got[-1])
    return got, out


# -- a real chatpage serve ------------------------------------------------------------------------


def test_a_forced_tool_call_and_a_grammar_go_through_chatpage_serve(url):
    """A named tool_choice goes to the server, whose grammar makes even a random model call the
    tool; the server reads the call, streams it as deltas, and the remote client folds them
    back. A choice grammar goes through as vLLM's structured_outputs."""
    params = SamplingParams(max_tokens=60, temperature=0)
    with connected(url) as client:
        updates, out = collect(client, params, tools=[WEATHER], tool_choice="get_weather")
        choice = SamplingParams(
            max_tokens=8,
            temperature=1.0,
            seed=1,
            structured=Structured(GrammarKind.CHOICE, json.dumps(["yes", "no"])),
        )
        _, answer = collect(client, choice)
    (output,) = out.outputs
    assert output.text == "" and output.finish_reason is FinishReason.STOP
    (call,) = output.tool_calls
    assert call.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
    pieces = [d for u in updates for o in u.outputs for d in o.tool_calls]
    assert len(pieces) > 1 and pieces[0].id == call.id
    assert answer.outputs[0].text in ("yes", "no")


# -- a server that answers as vLLM does -----------------------------------------------------------


def _chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


VLLM_STREAM = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"reasoning": "The user wants "}),
    _chunk({"reasoning": "the weather."}),
    _chunk(
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": "chatcmpl-tool-7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        }
    ),
    *(
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[i : i + 9]}}]})
        for i in range(0, len(ARGUMENTS), 9)
    ),
    _chunk({"content": ""}, "tool_calls"),
    b"data: [DONE]\n\n",
]
VLLM_WHOLE = {
    "id": "chatcmpl-2",
    "object": "chat.completion",
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Paris, then.",
                "tool_calls": [
                    {
                        "id": "chatcmpl-tool-8",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ARGUMENTS},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 20, "total_tokens": 32},
}


class VllmLike(BaseHTTPRequestHandler):
    """/v1/models (owned by vllm) and /v1/chat/completions: the stream above, or the whole
    answer for a request that is not streamed; every chat body is kept."""

    server: VllmServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, data: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            owner = self.server.owner
            models = {"data": [{"id": "m", "owned_by": owner, "max_model_len": 4096}]}
            self._send(200, json.dumps(models).encode())
        else:
            self._send(404, b'{"error": {"message": "not here"}}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        if not body.get("stream"):
            self._send(200, json.dumps(VLLM_WHOLE).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for piece in VLLM_STREAM:
            self.wfile.write(piece)
        self.close_connection = True


class VllmServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: str) -> None:
        super().__init__(("127.0.0.1", 0), VllmLike)
        self.owner = owner  # what /v1/models says owns the model (the probe names it so)
        self.bodies: list[dict] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def serving(owner: str) -> Iterator[VllmServer]:
    server = VllmServer(owner)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def vllm() -> Iterator[VllmServer]:
    with serving("vllm") as server:
        yield server


def test_vllm_tool_call_deltas_and_reasoning_are_read(vllm):
    schema = {"type": "object", "properties": {"unit": {"type": "string"}}}
    params = SamplingParams(
        max_tokens=40, structured=Structured(GrammarKind.JSON_SCHEMA, json.dumps(schema))
    )
    with connected(vllm.url) as client:
        updates, out = collect(client, params, tools=[WEATHER])
        _, whole = collect(client, SamplingParams(beam_width=2, temperature=0), tools=[WEATHER])
    sent = vllm.bodies[0]
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "auto"
    assert sent["response_format"]["json_schema"]["schema"] == schema
    (output,) = out.outputs
    assert output.reasoning == "The user wants the weather." and output.text == ""
    assert [(c.id, c.name, c.arguments) for c in output.tool_calls] == [
        ("chatcmpl-tool-7", "get_weather", ARGUMENTS)
    ]
    assert sum(len(o.tool_calls) for u in updates for o in u.outputs) > 2
    (beam,) = whole.outputs
    assert beam.reasoning == "Paris, then." and beam.tool_calls[0].arguments == ARGUMENTS
    assert beam.tool_calls[0].id == "chatcmpl-tool-8" and vllm.bodies[1]["tools"] == [WEATHER]


def test_a_forced_tool_choice_is_sent_for_the_server_to_constrain(vllm):
    with connected(vllm.url) as client:
        collect(client, SamplingParams(max_tokens=40), tools=[WEATHER], tool_choice="required")
        collect(client, SamplingParams(max_tokens=40), tools=[WEATHER], tool_choice="get_weather")
        collect(client, SamplingParams(max_tokens=40), tool_choice="required")  # no tools: none
    required, named, plain = vllm.bodies[-3:]
    assert required["tool_choice"] == "required" and required["tools"] == [WEATHER]
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert "tools" not in plain and "tool_choice" not in plain


def test_a_grammar_only_vllm_reads_is_refused_by_name_for_another_server():
    """SGLang and llama-server read no structured_outputs: a regex is refused before it goes,
    not sent to be ignored."""
    with serving("sglang") as sglang, connected(sglang.url) as client:
        _, out = collect(
            client, SamplingParams(max_tokens=4, structured=Structured(GrammarKind.REGEX, "a+"))
        )
        assert client.backend.name == "sglang" and sglang.bodies == []
    assert out.error is not None and "regex grammar" in out.error
    assert out.outputs[0].finish_reason is FinishReason.ERROR
