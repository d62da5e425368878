"""EngineClient: the thread-safe front the UI talks to (the one seam between ui/ and engine/).

The engine runs on its own thread: it loads the model, then steps whenever there is work.
Everything here is callable from any thread and never waits on a step. Requests are chat
messages (so a remote OpenAI-compatible backend can plug in here later); events come back through
the callback given at submit, called on the engine thread: a UI must hand them over to its own
thread without blocking (Textual: ``post_message``).
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatpage.engine.chat_template import continue_prompt, render_prompt, system_prefix
from chatpage.engine.config import EngineConfig
from chatpage.engine.outputs import EngineStats, RequestOutput
from chatpage.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch and the model code load on the engine thread (see _run), so that
    from chatpage.engine.llm_engine import LLMEngine  # the app paints before they are imported

__all__ = ["EngineClient", "EngineConfig", "EngineStats", "EventCallback", "SamplingParams",
           "StreamEvent"]
"""The engine's whole surface for the UI (ui/ imports the engine only through this module)."""


@dataclass(frozen=True, kw_only=True)
class StreamEvent:
    """What changed in one output of a request (index 0 for a plain reply); keyword-only."""

    request_id: str
    index: int
    text: str  # the whole text so far
    delta: str  # appended since the previous event of this index ("" if replaced)
    replaced: bool  # the text was rewritten, not appended to (beam search reorders beams)
    num_tokens: int
    finished: bool  # this output is complete
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    cumulative_logprob: float
    score: float | None  # beam search: the length-penalized score
    request_finished: bool  # every output of the request is complete
    prompt_tokens: int
    prefix_hit_tokens: int  # prompt tokens served from the prefix cache
    ttft_s: float | None
    elapsed_s: float  # since submit
    error: str | None = None
    token_ids: list[int] | None = None  # this output's generated token ids so far
    logprobs: list[float] | None = None  # their logprobs, when SamplingParams.logprobs is set
    num_outputs: int = 1  # outputs in the engine output this event came from (all of them once
    # request_finished: a reader knows it has every final output after that many such events)
    top_logprobs: list[dict[int, float]] | None = None  # per token: the most likely token ids ->
    # logprob, when SamplingParams.logprobs > 0


EventCallback = Callable[[StreamEvent], None]


class EngineClient:
    """Owns an engine thread; submit / cancel / stats from anywhere."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None) -> None:
        self.model = model
        self.config = config or EngineConfig()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._stats: EngineStats | None = None
        self._callbacks: dict[str, tuple[EventCallback, float, dict[int, str]]] = {}
        self._next_id = 0
        self._id_lock = threading.Lock()
        self.engine: LLMEngine | None = None
        self.error: str | None = None
        self.status = "starting"
        self.model_name = "model"
        self.max_model_len = 0
        self.warnings: list[str] = []
        self.load_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, on_status: Callable[[str], None] | None = None) -> None:
        """Load the model on the engine thread; ``on_status`` gets one-line progress messages."""
        self._on_status = on_status or (lambda _msg: None)
        self._thread = threading.Thread(target=self._run, name="chatpage-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.engine is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.ready

    def close(self) -> None:
        self._stopping = True
        self._commands.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, messages: list[dict[str, str]], params: SamplingParams,
               on_event: EventCallback, *, continue_reply: bool = False) -> str:
        """Queue a chat reply for ``messages`` (works before the model is ready). With
        ``continue_reply`` the last message is a reply to go on with: events carry only the
        new text and tokens."""
        return self._submit(messages, params, on_event,
                            continue_prompt if continue_reply else render_prompt)

    def submit_prompt(self, prompt: str | list[int], params: SamplingParams,
                      on_event: EventCallback) -> str:
        """Queue a completion of a raw ``prompt`` (text, or token ids), no chat template."""
        return self._submit(prompt, params, on_event, None)

    def _submit(self, prompt, params: SamplingParams, on_event: EventCallback, render) -> str:
        """Queue a request; ``render`` turns chat messages into token ids (None: a raw prompt)."""
        with self._id_lock:
            rid = f"chat-{self._next_id}"
            self._next_id += 1
        self._commands.put(("submit", rid, prompt, params, on_event, time.monotonic(), render))
        return rid

    def cancel(self, request_id: str) -> None:
        """Stop a request; its callback gets a final event with finish_reason "abort"."""
        self._commands.put(("cancel", request_id))

    def pin_system_prompt(self, system_prompt: str) -> None:
        """Prefill a persona's system prompt once and pin its blocks for every session to share."""
        self._commands.put(("pin", system_prompt))

    def stats(self) -> EngineStats | None:
        """The latest snapshot (taken after every engine step); None until the model is ready."""
        return self._stats

    # -- the engine thread -------------------------------------------------------------------------
    def _status(self, msg: str) -> None:
        self.status = msg
        self._on_status(msg)

    def _run(self) -> None:
        import torch  # the slow imports (~2 s): here, not before the app's first frame

        from chatpage.engine import ops
        from chatpage.engine.llm_engine import LLMEngine

        torch.set_num_threads(self.config.threads)  # this thread's own count (the UI has its own)
        try:
            t0 = time.perf_counter()
            engine = LLMEngine.from_pretrained(self.model, self.config, progress=self._status)
            # build (first run) or load the native kernels now, not in the first reply
            ops.set_notify(self._status)
            ops.available(torch.device(self.config.device))
        except Exception as e:  # reported to the UI, which keeps running
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            self._status(f"error: {self.error}")
            self._ready.set()
            self._answer_with_errors()
            return
        self.load_seconds = time.perf_counter() - t0
        self.engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.warnings = engine.warnings
        self._stats = engine.stats()
        self._ready.set()
        self._status("ready")
        reported = len(self.warnings)  # the load's warnings: shown by the UI at "ready"
        while not self._stopping:
            self._drain(block=not engine.has_unfinished())
            if self._stopping or not engine.has_unfinished():
                continue
            try:
                outputs = engine.step()
            except Exception:  # an engine bug must not take the UI down silently
                self.error = traceback.format_exc().strip().splitlines()[-1]
                self._status(f"engine error: {self.error}")
                for rid in list(self._callbacks):
                    engine.abort(rid)
                    self._emit_final(rid, "error", self.error)
                continue
            for out in outputs:
                self._dispatch(out)
            self._stats = engine.stats()
            while len(self.warnings) > reported:  # raised while stepping (e.g. CUDA graphs off)
                self._status(f"warning: {self.warnings[reported]}")
                reported += 1

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, cmd: tuple) -> None:
        """Run one command; a failure is reported (on its request, or as a status line for a pin)
        and the thread keeps serving."""
        engine = self.engine
        kind = cmd[0]
        try:
            if kind == "submit":
                _, rid, prompt, params, on_event, t0, render = cmd
                self._callbacks[rid] = (on_event, t0, {})
                ids = render(engine.tokenizer, prompt) if render else prompt
                engine.add_request(ids, params, request_id=rid)
            elif kind == "cancel":
                if engine.abort(cmd[1]):
                    self._emit_final(cmd[1], "abort", None)
            elif kind == "pin":
                engine.pin_prefix(system_prefix(engine.tokenizer, cmd[1]))
        except Exception as e:  # bad input or a template error: this command fails, not the thread
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            if kind == "submit":
                self._emit_final(cmd[1], "error", why)
            else:
                self._status(f"error: {kind} failed: {why}")
        self._stats = engine.stats()

    def _answer_with_errors(self) -> None:
        """No model: every submit, queued or later, gets a final error event."""
        while not self._stopping:
            try:
                cmd = self._commands.get(timeout=0.5)
            except queue.Empty:
                continue
            if cmd[0] == "submit":
                _, rid, _msgs, _params, on_event, t0, _render = cmd
                self._callbacks[rid] = (on_event, t0, {})
                self._emit_final(rid, "error", f"the model did not load: {self.error}")

    def _emit_final(self, rid: str, reason: str, error: str | None) -> None:
        entry = self._callbacks.pop(rid, None)
        if entry is None:
            return
        on_event, t0, texts = entry
        indices = sorted(texts) or [0]
        for index in indices:
            on_event(StreamEvent(
                request_id=rid, index=index, text=texts.get(index, ""), delta="", replaced=False,
                num_tokens=0, finished=True, finish_reason=reason, cumulative_logprob=0.0,
                score=None, request_finished=True, prompt_tokens=0, prefix_hit_tokens=0,
                ttft_s=None, elapsed_s=time.monotonic() - t0, error=error,
                num_outputs=len(indices),
            ))

    def _dispatch(self, out: RequestOutput) -> None:
        entry = self._callbacks.get(out.request_id)
        if entry is None:  # a pinned prefix, or a request of the engine's own
            return
        on_event, t0, texts = entry
        if out.finished:
            del self._callbacks[out.request_id]
        elapsed = time.monotonic() - t0
        for c in out.outputs:
            before = texts.get(c.index, "")
            appended = c.text.startswith(before)
            texts[c.index] = c.text
            on_event(StreamEvent(
                request_id=out.request_id, index=c.index, text=c.text,
                delta=c.text[len(before):] if appended else "", replaced=not appended,
                num_tokens=len(c.token_ids),
                finished=c.finish_reason is not None or out.finished,
                finish_reason=c.finish_reason, cumulative_logprob=c.cumulative_logprob,
                score=c.score, request_finished=out.finished,
                prompt_tokens=len(out.prompt_token_ids), prefix_hit_tokens=out.prefix_hit_tokens,
                ttft_s=out.ttft_s, elapsed_s=elapsed, error=out.error,
                token_ids=c.token_ids, logprobs=c.logprobs, num_outputs=len(out.outputs),
                top_logprobs=c.top_logprobs,
            ))
