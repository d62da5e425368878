"""LocalEngineClient keeps serving when a command fails (issue 10, item 5): the failure becomes
the error update ending its request, or a status line for a pin, and the next request is
answered."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from chatpage.config import errorlog
from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.client import ChatRequest, FinishReason, LocalEngineClient, RequestUpdate
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
    client.submit(ChatRequest(messages, SamplingParams(temperature=0, max_tokens=3)), reply)
    assert reply.done.wait(20), "no final update: the engine thread stopped serving"
    return reply.out


def _client(model_dir, blocks: int) -> LocalEngineClient:
    client = LocalEngineClient(str(model_dir), EngineConfig(kv_cache_bytes=blocks * BLOCK_BYTES))
    statuses: list[str] = []
    client.start(lambda status: statuses.append(str(status)))  # each line as shown
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
        last = _ask(
            client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
        )
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
        assert warned == [
            "warning: CUDA graphs are off (capture failed: operation not permitted "
            "when stream is capturing)"
        ]
    finally:
        client.close()


def test_a_cancel_and_a_refused_request_each_end_with_one_explicit_final_update(tiny_llama_dir):
    client = _client(tiny_llama_dir, 32)
    try:
        reply = _Reply()
        rid = client.submit(
            ChatRequest(
                [{"role": "user", "content": "hi"}],
                SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=200),
            ),
            reply,
        )
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
        client.submit(
            ChatRequest(
                [{"role": "user", "content": "word " * 5000}], SamplingParams(max_tokens=3)
            ),
            refused,
        )
        assert refused.done.wait(20)
        (final,) = refused.updates
        assert final.outputs[0].finish_reason is FinishReason.ERROR
        assert "context window" in final.error
        client.cancel(rid)  # a request already ended: nothing more comes
        assert _ask(client, [{"role": "user", "content": "hi"}]).error is None
        assert len(reply.updates) == sent  # nothing after the final update
    finally:
        client.close()


def _cpu_seconds(thread: threading.Thread) -> float:
    """CPU time ``thread`` has used so far (its own clock)."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


@pytest.mark.slow  # waits out a client's deadline
def test_a_failed_step_ends_pins_like_requests_and_the_idle_engine_thread_blocks(tiny_llama_dir):
    """A step that raises (here the real runner, made to fail while `broken` is set) ends every
    request and every pin in the engine with the error; nothing is left to step, so the engine
    thread waits for work (no CPU while idle) instead of failing the same step over and over,
    and once the device works again the next request is answered (issue 20, item 5)."""
    client = _client(tiny_llama_dir, 32)
    engine = client.engine
    real = engine.runner.execute
    broken = threading.Event()

    def execute(scheduled):
        if broken.is_set():
            raise RuntimeError("device lost")
        return real(scheduled)

    engine.runner.execute = execute
    try:
        broken.set()
        client.pin_system_prompt("You are terse.")
        reply = _Reply()
        client.submit(
            ChatRequest([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=3)), reply
        )
        assert reply.done.wait(20)
        assert reply.out.error == "RuntimeError: device lost"
        assert reply.out.outputs[0].finish_reason is FinishReason.ERROR
        deadline = time.monotonic() + 20
        while engine.has_unfinished() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not engine.has_unfinished(), sorted(engine.groups)  # the pin ended too
        stats = engine.stats()
        assert stats.blocks_used == stats.blocks_pinned == 0
        before = _cpu_seconds(client._thread)
        time.sleep(1.0)
        assert _cpu_seconds(client._thread) - before < 0.05  # blocked on its queue
        assert any(
            s.startswith("error: the engine failed: RuntimeError: device lost")
            for s in client.statuses
        ), client.statuses
        broken.clear()
        assert client.error is None  # a failed step is not a broken engine
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.error is None and last.outputs[0].num_tokens == 3
    finally:
        client.close()


def test_a_raising_update_callback_is_logged_and_stops_only_its_request(tiny_llama_dir):
    """A consumer whose callback raises once took the engine thread down without a word
    (issue 20, item 8): now the error is logged, that request is stopped, the others go on."""
    client = _client(tiny_llama_dir, 32)

    def broken(update: RequestUpdate) -> None:
        raise KeyError("consumer bug")

    try:
        rid = client.submit(
            ChatRequest(
                [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=200, ignore_eos=True)
            ),
            broken,
        )
        last = _ask(client, [{"role": "user", "content": "hi"}])
        assert last.error is None and last.outputs[0].num_tokens == 3
        deadline = time.monotonic() + 20
        while rid in client.engine.groups and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rid not in client.engine.groups  # stopped: nobody takes its updates
        log = errorlog.log_path().read_text()
        assert f"the update callback of request {rid}: 'consumer bug'" in log
        assert "KeyError" in log
    finally:
        client.close()


def test_prompts_and_system_prompts_are_tokenized_off_the_engine_thread(tiny_llama_dir):
    """The engine thread steps the running requests while a new prompt is tokenized (issue 20,
    item 2); a prompt of more characters than the context window can hold whatever its tokens
    is refused before it is tokenized at all."""
    client = _client(tiny_llama_dir, 32)
    tokenizer = client.engine.tokenizer
    real = tokenizer.encode
    threads: list[str] = []

    def encode(text, add_special_tokens=True):
        threads.append(threading.current_thread().name)
        return real(text, add_special_tokens=add_special_tokens)

    tokenizer.encode = encode
    try:
        client.pin_system_prompt("You are terse.")
        assert _ask(client, [{"role": "user", "content": "hi"}]).error is None
        reply = _Reply()
        client.submit_prompt("Once upon a time", SamplingParams(max_tokens=2), reply)
        assert reply.done.wait(20) and reply.out.error is None
        assert len(threads) >= 3 and set(threads) == {"chatpage-tokenizer"}, threads
        threads.clear()
        huge = _Reply()
        client.submit(
            ChatRequest(
                [{"role": "user", "content": "x" * (32 * client.max_model_len + 1)}],
                SamplingParams(max_tokens=2),
            ),
            huge,
        )
        assert huge.done.wait(20)
        assert huge.out.error.startswith(
            f"the prompt is {32 * client.max_model_len + 1} "
            "characters, far more than the context window"
        )
        assert threads == []  # refused by its length, never tokenized
    finally:
        client.close()


def test_tool_descriptions_and_call_arguments_count_before_anything_is_tokenized(tiny_llama_dir):
    """Every text a chat renders counts against the context window's characters, not only the
    messages' content: the tools offered (a 4 MB description) and the arguments of the calls
    in the history are refused before any of it is tokenized (issue 40, item 5)."""
    client = _client(tiny_llama_dir, 32)
    tokenizer = client.engine.tokenizer
    real = tokenizer.encode
    encoded: list[int] = []

    def encode(text, add_special_tokens=True):
        encoded.append(len(text))
        return real(text, add_special_tokens=add_special_tokens)

    tokenizer.encode = encode
    big = 4 << 20
    tool = {
        "type": "function",
        "function": {"name": "read", "description": "x" * big, "parameters": {}},
    }
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": ""}}
    call["function"]["arguments"] = '{"path": "' + "y" * big + '"}'
    history = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "done", "tool_call_id": "c1"},
    ]
    try:
        for messages, tools, said in (
            ([{"role": "user", "content": "hi"}], [tool], "of them the tools offered, far more"),
            (history, None, "characters, far more"),
        ):
            reply = _Reply()
            client.submit(ChatRequest(messages, SamplingParams(max_tokens=2), tools=tools), reply)
            assert reply.done.wait(20)
            error = reply.out.error
            assert error.startswith("the prompt is ") and said in error and "\n" not in error
            assert max(encoded, default=0) < big  # refused by its length, never tokenized
        assert _ask(client, [{"role": "user", "content": "hi"}]).error is None  # the next one
    finally:
        client.close()
