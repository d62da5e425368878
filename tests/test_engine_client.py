"""LocalEngineClient keeps serving when a command fails (issue 10, item 5): the failure becomes
the error update ending its request, or a status line for a pin, and the next request is
answered."""

from __future__ import annotations

import shutil
import threading

from chatpage.config import errorlog
from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.client import FinishReason, LocalEngineClient, RequestUpdate
from chatpage.engine.outputs import RequestOutput

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32
NO_SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


class _Reply:
    def __init__(self) -> None:
        self.updates: list[RequestUpdate] = []
        self.outputs = OutputAccumulator()
        self.out: RequestOutput | None = None
        self.done = threading.Event()

    def __call__(self, update: RequestUpdate) -> None:
        self.updates.append(update)
        self.out = self.outputs.add(update)
        if update.finished:
            self.done.set()


def _ask(client: LocalEngineClient, messages: list[dict[str, str]]) -> RequestOutput:
    reply = _Reply()
    client.submit(messages, SamplingParams(temperature=0, max_tokens=3), reply)
    assert reply.done.wait(20), "no final update: the engine thread stopped serving"
    return reply.out


def _client(model_dir, blocks: int) -> LocalEngineClient:
    client = LocalEngineClient(str(model_dir), EngineConfig(kv_cache_bytes=blocks * BLOCK_BYTES))
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
        assert last.outputs[0].finish_reason is FinishReason.ERROR
        assert "System role not supported" in last.error
        assert any("System role not supported" in s for s in client.statuses), client.statuses
        log = errorlog.log_path().read_text()  # the whole story behind the one line
        assert "engine command submit: System role not supported" in log
        assert "Traceback (most recent call last)" in log and "TemplateError" in log
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.outputs[0].finish_reason is FinishReason.LENGTH and last.error is None
        assert last.outputs[0].num_tokens == 3 == last.usage.completion_tokens
    finally:
        client.close()


def test_a_system_prompt_too_large_to_pin_leaves_the_engine_serving(tiny_llama_dir):
    client = _client(tiny_llama_dir, 8)
    try:
        client.pin_system_prompt("word " * 400)
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.outputs[0].finish_reason is FinishReason.LENGTH and last.error is None
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
        assert last.outputs[0].finish_reason is FinishReason.LENGTH
        assert last.outputs[0].num_tokens == 3
        warned = [s for s in client.statuses if s.startswith("warning: ")]
        assert warned == ["warning: CUDA graphs are off (capture failed: operation not permitted "
                          "when stream is capturing)"]
    finally:
        client.close()


def test_a_cancel_and_a_refused_request_each_end_with_one_explicit_final_update(tiny_llama_dir):
    client = _client(tiny_llama_dir, 32)
    try:
        reply = _Reply()
        rid = client.submit([{"role": "user", "content": "hi"}],
                            SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=200), reply)
        while not reply.updates:
            threading.Event().wait(0.01)
        client.cancel(rid)
        assert reply.done.wait(20)
        final = reply.updates[-1]
        assert final.error is None and [d.index for d in final.outputs] == [0, 1]
        assert all(d.finish_reason is FinishReason.ABORT and not d.text for d in final.outputs)
        assert [c.finish_reason for c in reply.out.outputs] == [FinishReason.ABORT] * 2
        sent = len(reply.updates)

        refused = _Reply()
        client.submit([{"role": "user", "content": "word " * 5000}],
                      SamplingParams(max_tokens=3), refused)
        assert refused.done.wait(20)
        (final,) = refused.updates
        assert final.outputs[0].finish_reason is FinishReason.ERROR
        assert "context window" in final.error
        client.cancel(rid)  # a request already ended: nothing more comes
        assert _ask(client, [{"role": "user", "content": "hi"}]).error is None
        assert len(reply.updates) == sent  # nothing after the final update
    finally:
        client.close()
