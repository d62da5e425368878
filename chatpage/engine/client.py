"""LocalEngineClient: the paged engine on a thread of this process, behind `EngineClient`.

The engine runs on its own thread: it loads the model, then steps whenever there is work.
Everything here is callable from any thread and never waits on a step. Requests are chat
messages (or raw prompts); each engine step's `RequestUpdate` for a request goes to the callback
given at submit, called on the engine thread (`chatpage.engine.protocol` says how to take it).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from chatpage.config.errorlog import log_error
from chatpage.engine.chat_template import continue_prompt, render_prompt, system_prefix
from chatpage.engine.config import EngineConfig
from chatpage.engine.outputs import (
    EngineStats,
    FinishReason,
    OutputDelta,
    RequestUpdate,
    Usage,
    final_update,
)
from chatpage.engine.protocol import EngineClient, UpdateCallback
from chatpage.engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # torch and the model code load on the engine thread (see _run), so that
    from chatpage.engine.llm_engine import LLMEngine  # the app paints before they are imported

__all__ = ["EngineClient", "EngineConfig", "EngineStats", "FinishReason", "LocalEngineClient",
           "OutputDelta", "RequestUpdate", "SamplingParams", "UpdateCallback", "Usage"]
"""The engine's whole surface for the UI (ui/ imports the engine only through this module)."""


class LocalEngineClient:
    """Owns an engine thread; submit / cancel / stats from anywhere."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None) -> None:
        self.model = model
        self.config = config or EngineConfig()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._stats: EngineStats | None = None
        self._callbacks: dict[str, tuple[UpdateCallback, float]] = {}
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

    # -- requests (see `EngineClient`) ---------------------------------------------------------------
    def submit(self, messages: list[dict[str, str]], params: SamplingParams,
               on_update: UpdateCallback, *, continue_reply: bool = False) -> str:
        return self._submit(messages, params, on_update,
                            continue_prompt if continue_reply else render_prompt)

    def submit_prompt(self, prompt: str | list[int], params: SamplingParams,
                      on_update: UpdateCallback) -> str:
        return self._submit(prompt, params, on_update, None)

    def _submit(self, prompt, params: SamplingParams, on_update: UpdateCallback, render) -> str:
        """Queue a request; ``render`` turns chat messages into token ids (None: a raw prompt)."""
        with self._id_lock:
            rid = f"chat-{self._next_id}"
            self._next_id += 1
        self._commands.put(("submit", rid, prompt, params, on_update, time.monotonic(), render))
        return rid

    def cancel(self, request_id: str) -> None:
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
            ops.available(engine.device)
        except Exception as e:  # reported to the UI, which keeps running
            self.error = log_error(e, f"loading the model {self.model or '(default)'}")
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
                updates = engine.step()
            except Exception as e:  # an engine bug must not take the UI down silently
                self.error = f"{type(e).__name__}: {log_error(e, 'engine step')}"
                self._status(f"engine error: {self.error}")
                for rid in list(self._callbacks):
                    update = engine.abort(rid, FinishReason.ERROR, self.error)
                    if update is None:  # (refused at submit, its end not sent yet)
                        self._fail(rid, self.error)
                    else:
                        self._dispatch(update)
                continue
            for update in updates:
                self._dispatch(update)
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
                _, rid, prompt, params, on_update, t0, render = cmd
                self._callbacks[rid] = (on_update, t0)
                ids = render(engine.tokenizer, prompt) if render else prompt
                engine.add_request(ids, params, request_id=rid)
            elif kind == "cancel":
                update = engine.abort(cmd[1])
                if update is not None:
                    self._dispatch(update)
            elif kind == "pin":
                engine.pin_prefix(system_prefix(engine.tokenizer, cmd[1]))
        except Exception as e:  # bad input or a template error: this command fails, not the thread
            why = log_error(e, f"engine command {kind}")
            if kind == "submit":
                self._fail(cmd[1], why)
            else:
                self._status(f"error: {kind} failed: {why}")
        self._stats = engine.stats()

    def _answer_with_errors(self) -> None:
        """No model: every submit, queued or later, gets a final error update."""
        while not self._stopping:
            try:
                cmd = self._commands.get(timeout=0.5)
            except queue.Empty:
                continue
            if cmd[0] == "submit":
                _, rid, _msgs, _params, on_update, t0, _render = cmd
                self._callbacks[rid] = (on_update, t0)
                self._fail(rid, f"the model did not load: {self.error}")

    def _fail(self, rid: str, why: str) -> None:
        """A request the engine does not hold: its one update ends it with ``why``."""
        entry = self._callbacks.get(rid)
        if entry is not None:
            self._dispatch(final_update(rid, FinishReason.ERROR, error=why,
                                        elapsed_s=time.monotonic() - entry[1]))

    def _dispatch(self, update: RequestUpdate) -> None:
        entry = self._callbacks.get(update.request_id)
        if entry is None:  # a pinned prefix, or a request of the engine's own
            return
        if update.finished:
            del self._callbacks[update.request_id]
        entry[0](update)
