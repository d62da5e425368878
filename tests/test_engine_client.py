"""EngineClient keeps serving when a command fails (issue 10, item 5): the failure becomes an
error event on its request, or a status line for a pin, and the next request is answered."""

from __future__ import annotations

import shutil
import threading

from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.client import EngineClient, StreamEvent

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


class _Reply:
    def __init__(self) -> None:
        self.events: list[StreamEvent] = []
        self.done = threading.Event()

    def __call__(self, event: StreamEvent) -> None:
        self.events.append(event)
        if event.request_finished:
            self.done.set()


def _ask(client: EngineClient, messages: list[dict[str, str]]) -> StreamEvent:
    reply = _Reply()
    client.submit(messages, SamplingParams(temperature=0, max_tokens=3), reply)
    assert reply.done.wait(20), "no final event: the engine thread stopped serving"
    return reply.events[-1]


def _client(model_dir, blocks: int) -> EngineClient:
    client = EngineClient(str(model_dir), EngineConfig(kv_cache_bytes=blocks * BLOCK_BYTES))
    statuses: list[str] = []
    client.start(statuses.append)
    assert client.wait_ready(120), client.error
    client.statuses = statuses
    return client


def test_a_template_that_rejects_the_system_role_fails_only_that_request(tiny_llama_dir, tmp_path):
    model = tmp_path / "no-system"
    shutil.copytree(tiny_llama_dir, model)
    (model / "chat_template.jinja").write_text(NO_SYSTEM_TEMPLATE)
    client = _client(model, 32)
    try:
        client.pin_system_prompt("You are terse.")
        last = _ask(client, [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "hi"}])
        assert last.finish_reason == "error" and "System role not supported" in last.error
        assert any("System role not supported" in s for s in client.statuses), client.statuses
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.finish_reason == "length" and last.error is None and last.num_tokens == 3
    finally:
        client.close()


def test_a_system_prompt_too_large_to_pin_leaves_the_engine_serving(tiny_llama_dir):
    client = _client(tiny_llama_dir, 8)
    try:
        client.pin_system_prompt("word " * 400)
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.finish_reason == "length" and last.error is None
        assert any("KV blocks" in s for s in client.statuses), client.statuses
    finally:
        client.close()


def test_a_warning_raised_while_stepping_reaches_the_status_line(tiny_llama_dir):
    """CUDA graphs that cannot be captured fall back to eager steps and say so (here the same
    bookkeeping on the CPU with a capture that fails); the reply still comes."""
    client = _client(tiny_llama_dir, 32)

    def failing(forward, inputs, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    try:
        client.engine.runner.use_graphs(failing)
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.finish_reason == "length" and last.num_tokens == 3
        warned = [s for s in client.statuses if s.startswith("warning: ")]
        assert warned == ["warning: CUDA graphs are off (capture failed: operation not permitted "
                          "when stream is capturing)"]
    finally:
        client.close()
