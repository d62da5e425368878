"""RemoteEngineClient: the `EngineClient` protocol over an OpenAI-compatible server.

An asyncio loop on its own thread holds one ``httpx.AsyncClient``: it probes the server (retrying
while it cannot be reached), streams every request over SSE (cancel = close the stream, which
makes the server abort it), and polls ``/metrics`` about once a second for the gauge. Updates reach
the caller's callback on that thread, exactly like the local engine's.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from chatpage.config.settings import DEFAULT_BACKEND_TIMEOUT_S
from chatpage.engine.protocol import (
    READY,
    STARTING,
    ChatRequest,
    EngineStatus,
    StatusCallback,
    StatusKind,
    TokenCounter,
    UpdateCallback,
)
from chatpage.engine.sampling_params import SamplingParams
from chatpage.remote.backend import Backend, BackendError, BackendNotReady, probe
from chatpage.remote.requests import RemoteReply, RequestFailed, run_request, split_samples
from chatpage.remote.stats import Poller, RemoteStats, engine_stats
from chatpage.vocab import FinishReason
from chatpage.wire.tools import ToolRequest

API_KEY_ENV = "CHATPAGE_API_KEY"
POLL_S = 1.0
RETRY_S = 2.0
CONNECT_TIMEOUT_S = 10.0

Payload = list[dict[str, Any]] | str | list[int]
"""A request's messages (a chat, or a reply to continue), or a completion's prompt."""


@dataclass(frozen=True)
class Submitted:
    """A request as submitted, held until the server is reachable (then begun as it is)."""

    rid: str
    kind: str  # chat, continue, completion (`request_body`)
    payload: Payload
    params: SamplingParams
    on_update: UpdateCallback
    t_submit: float
    tools: ToolRequest | None

    def reply(self) -> RemoteReply:
        """Where this request's choices go (its updates, to its callback)."""
        return RemoteReply(self.rid, self.on_update, self.t_submit)


class RemoteEngineClient:
    """Talks to the server at ``url``; ``model`` None uses the first model it serves.
    An `EngineClient` whose stats are `RemoteStats`.

    ``timeout_s`` is the longest the server may stay silent: waiting for an answer, or for the
    next data line of a stream (keep-alive comments do not count); a reply then fails."""

    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_BACKEND_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        self._headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.backend: Backend | None = None
        self.error: str | None = None
        self.status = STARTING
        self.model_name = "model"
        self.max_model_len = 0
        self.warnings: list[str] = []
        self.counter: TokenCounter | None = None  # the server counts: the chat estimates
        self.thinking_switch: str | None = None  # the server's template: not known here
        self.load_seconds: float | None = None
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._reachable = False
        self._http: httpx.AsyncClient | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._pending: list[Submitted] = []
        self._pins: list[tuple[str, list[dict[str, Any]] | None]] = []
        self._ids = itertools.count()
        self._id_lock = threading.Lock()
        self._stats: RemoteStats | None = None
        self._note: str | None = None
        self._poller = Poller()
        self._on_status: StatusCallback = lambda _status: None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, on_status: StatusCallback | None = None) -> None:
        """Connect on the client's thread; ``on_status`` gets each status."""
        self._on_status = on_status or (lambda _status: None)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="chatpage-remote", daemon=True
        )
        self._thread.start()
        self._call(self._connect)

    @property
    def ready(self) -> bool:
        return self.backend is not None and self._reachable

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.ready

    def close(self) -> None:
        if self._thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._thread = None
        self._loop.close()

    # -- requests ----------------------------------------------------------------------------------
    def submit(self, request: ChatRequest, on_update: UpdateCallback) -> str:
        """Queue a chat reply (held until the server is reachable). ``reply_ids`` are not
        used: the server renders the prompt itself. ``tools`` go in the request with
        ``tool_choice`` (the server offers them, and constrains a forced call itself; its
        streamed calls come back as tool-call deltas). ``thinking`` other than None and
        ``add_special_tokens`` are refused (ValueError): the server's template cannot be seen
        from here (`thinking_switch` is None), nor its rendered prompt changed."""
        if request.thinking is not None:
            raise ValueError(
                "over --backend the server renders the prompt: chatpage cannot switch its "
                "model's thinking"
            )
        if request.add_special_tokens:
            raise ValueError(
                "over --backend the server renders the prompt: chatpage cannot add special "
                "tokens to it"
            )
        kind = "continue" if request.continue_reply else "chat"
        tools = request.tools
        offer = ToolRequest(tools, request.tool_choice) if tools else None
        return self._submit(kind, request.messages, request.params, on_update, offer)

    def submit_prompt(
        self, prompt: str | list[int], params: SamplingParams, on_update: UpdateCallback
    ) -> str:
        """Queue a completion of a raw ``prompt`` (text, or token ids)."""
        return self._submit("completion", prompt, params, on_update)

    def cancel(self, request_id: str) -> None:
        """Stop a request: its stream is closed and the server aborts it."""
        self._call(self._cancel, request_id)

    def pin_system_prompt(
        self, system_prompt: str, tools: list[dict[str, Any]] | None = None
    ) -> None:
        """Warm the server's prefix cache with a persona's system prompt and ``tools`` (vLLM
        and SGLang cache prefixes automatically; chatpage serve pins its personas itself)."""
        self._call(self._pin, system_prompt, tools)

    def stats(self) -> RemoteStats | None:
        """The latest figures polled from the server (None before the first poll)."""
        return self._stats

    # -- on the client's loop ----------------------------------------------------------------------
    def _call(self, fn: Callable[..., object], *args: object) -> None:
        self._loop.call_soon_threadsafe(fn, *args)

    def _submit(
        self,
        kind: str,
        payload: Payload,
        params: SamplingParams,
        on_update: UpdateCallback,
        tools: ToolRequest | None = None,
    ) -> str:
        with self._id_lock:
            rid = f"remote-{next(self._ids)}"
        submitted = Submitted(rid, kind, payload, params, on_update, time.monotonic(), tools)
        self._call(self._begin, submitted)
        return rid

    @property
    def http(self) -> httpx.AsyncClient:
        """The HTTP client, made when this client's loop starts (`_connect`)."""
        if self._http is None:
            raise RuntimeError("the remote client has not started")
        return self._http

    def _found(self) -> Backend:
        """The server the probe found (asked for only once it has answered)."""
        if self.backend is None:
            raise RuntimeError(f"{self.url} has not been probed yet")
        return self.backend

    def _status(self, status: EngineStatus) -> None:
        self.status = status
        self._on_status(status)

    def _progress(self, text: str) -> None:
        """A step of connecting (or of reconnecting to a server lost)."""
        self._status(EngineStatus(StatusKind.PROGRESS, text))

    def _connect(self) -> None:
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers,
            timeout=httpx.Timeout(CONNECT_TIMEOUT_S, read=self.timeout_s),
        )
        self._tasks["connect"] = self._loop.create_task(self._probe_and_poll())

    async def _probe_and_poll(self) -> None:
        t0 = time.perf_counter()
        self._progress(f"connecting to {self.url}")
        while self.backend is None:
            try:
                backend = await probe(self.http, self.url, self.model)
            except BackendError as e:
                self._give_up(str(e))
                return
            except httpx.TransportError as e:
                self._progress(
                    f"cannot reach {self.url} ({self._reason(e)}); retrying every {RETRY_S:.0f} s"
                )
                await asyncio.sleep(RETRY_S)
                continue
            except BackendNotReady as e:
                self._progress(f"{e}; retrying every {RETRY_S:.0f} s")
                await asyncio.sleep(RETRY_S)
                continue
            except Exception as e:  # an answer the probe cannot read: say so, never hang
                self._give_up(
                    f"unexpected answer from {self.url} while probing it: {type(e).__name__}: {e}"
                )
                return
            self.backend = backend
        self.load_seconds = time.perf_counter() - t0
        self.model_name = f"{backend.model} on {backend.label}"
        self.max_model_len = backend.max_model_len
        self.warnings = backend.notes()
        self._reachable = True
        await self._poll_once()
        self._ready.set()
        self._status(READY)
        for submitted in self._pending:
            self._begin(submitted)
        self._pending.clear()
        for prompt, tools in self._pins:
            self._pin(prompt, tools)
        while True:
            await asyncio.sleep(POLL_S)
            await self._poll_once()

    def _give_up(self, error: str) -> None:
        """The server cannot be used: say why, and fail the replies waiting for it."""
        self.error = error
        self._status(EngineStatus(StatusKind.ERROR, error))
        self._ready.set()
        for submitted in self._pending:
            submitted.reply().fail(error)
        self._pending.clear()

    async def _poll_once(self) -> None:
        backend = self._found()
        label = f"{backend.label} at {self.url}"
        notes = (self._note,) if self._note else ()
        try:
            text = engine = None
            if backend.can("metrics"):
                r = await self.http.get("/metrics")
                text = r.text if r.status_code == 200 else None
            if backend.can("stats"):
                r = await self.http.get("/v1/chatpage/stats")
                if r.status_code == 200:
                    engine = engine_stats(_json_or_none(r))
                    if engine is None:
                        notes = (
                            *notes,
                            f"{self.url}/v1/chatpage/stats is not a whole set of "
                            "block-pool figures; ignored",
                        )
        except httpx.HTTPError as e:
            if self._reachable:
                self._reachable = False
                self._progress(
                    f"lost {self.url} ({self._reason(e)}); retrying every {POLL_S:.0f} s"
                )
            self._stats = RemoteStats(label, False, notes=notes)
            return
        self._stats = self._poller.stats(label, text, time.monotonic(), engine, notes)
        if not self._reachable:
            self._reachable = True
            self._status(READY)

    def _begin(self, submitted: Submitted) -> None:
        if self.backend is None:
            if self.error is not None:
                submitted.reply().fail(self.error)
            else:
                self._pending.append(submitted)
            return
        reply, params, rid = submitted.reply(), submitted.params, submitted.rid
        parts = split_samples(self.backend, params)
        if len(parts) > 1:
            seeds = ", ".join(str(p.seed) for p in parts)
            self._note = (
                f"n={params.n} sent as {len(parts)} requests (seeds {seeds}): "
                f"{self.backend.label} answers one sample per request"
            )
        task = self._loop.create_task(
            self._run(reply, submitted.kind, submitted.payload, parts, submitted.tools)
        )
        self._tasks[rid] = task
        task.add_done_callback(lambda _t: self._tasks.pop(rid, None))

    async def _run(
        self,
        reply: RemoteReply,
        kind: str,
        payload: Payload,
        parts: list[SamplingParams],
        tools: ToolRequest | None,
    ) -> None:
        try:
            await asyncio.gather(
                *(
                    run_request(
                        self.http,
                        self._found(),
                        reply,
                        kind,
                        payload,
                        p,
                        index,
                        self.timeout_s,
                        tools,
                    )
                    for index, p in enumerate(parts)
                )
            )
        except asyncio.CancelledError:
            reply.finish(FinishReason.ABORT)
            return
        except RequestFailed as e:
            reply.fail(str(e))
            return
        except httpx.TransportError as e:
            reply.fail(f"lost the connection to {self.url} ({self._reason(e)})")
            return
        except Exception as e:  # a reply the client cannot read ends with an error, never hangs
            reply.fail(f"unexpected answer from {self.url}: {type(e).__name__}: {e}")
            return
        reply.finish(None)

    def _cancel(self, rid: str) -> None:
        task = self._tasks.get(rid)
        if task is not None:
            task.cancel()
            return
        for i, submitted in enumerate(self._pending):
            if submitted.rid == rid:
                del self._pending[i]
                submitted.reply().finish(FinishReason.ABORT)
                return

    def _pin(self, prompt: str, tools: list[dict[str, Any]] | None) -> None:
        if self.backend is None:
            self._pins.append((prompt, tools))
        elif self.backend.name in ("vllm", "sglang"):
            body: dict[str, Any] = {
                "model": self.backend.model,
                "max_tokens": 1,
                "messages": [{"role": "system", "content": prompt}],
            }
            if tools:
                body["tools"] = tools
            self._loop.create_task(self._warm(body))

    async def _warm(self, body: dict[str, Any]) -> None:
        try:
            await self.http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError:  # only a warm-up: the poller reports an unreachable server
            pass

    async def _shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._http is not None:
            await self._http.aclose()
        await self._loop.shutdown_asyncgens()

    def _reason(self, error: Exception) -> str:
        """Why a request did not get through, in a few words."""
        if isinstance(error, httpx.ReadTimeout):
            return f"it sent nothing for {self.timeout_s:g} s"
        text = str(error).strip()
        return text.splitlines()[0] if text else type(error).__name__


def _json_or_none(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None
