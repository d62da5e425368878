"""The Starlette app of `chatpage serve`: routes over one `ServingClient` (the local engine's).

``/v1/*`` needs the API key when one is set; ``/health`` and ``/metrics`` never do (as in vLLM).
A server with no key answers every route only under its own names (`HostGuard`: DNS rebinding).
Every request handler only awaits its own queue of engine events (see `bridge`), and a client
that goes away cancels its request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.metadata
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import asdict, replace
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from chatpage.config.personas import Persona
from chatpage.engine.outputs import OutputDelta
from chatpage.engine.protocol import ServingClient
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.grammar import COMPILE_TIMEOUT_S, too_slow
from chatpage.serve import metrics
from chatpage.serve.bridge import EventPump, RequestStream
from chatpage.serve.limits import ServeLimits, check_keyless, read_json
from chatpage.vocab import FinishReason, Role
from chatpage.wire.chunks import DONE, ChunkWriter, sse, sse_error
from chatpage.wire.errors import ApiError, bad_value
from chatpage.wire.requests import ApiRequest, parse_request
from chatpage.wire.structured import structured_field

SWITCH_INTERVAL_S = 0.0005
"""The GIL hand-over interval while serving (Python's default is 5 ms): the engine thread's
Python code between kernels would otherwise hold a streamed token back up to 5 ms."""
PERSONA_PREFIX = "chatpage/"
OWNER = "chatpage"
T = TypeVar("T")


class ServeState:
    """What every handler shares: the engine client, the key, the personas and the counters."""

    def __init__(
        self,
        client: ServingClient,
        api_key: str | None,
        personas: list[Persona],
        host: str = "127.0.0.1",
        limits: ServeLimits | None = None,
    ) -> None:
        self.client = client
        self.api_key = api_key
        self.host = host  # the address it listens on (a keyless server answers only its names)
        self.limits = limits or ServeLimits()
        self.personas = {PERSONA_PREFIX + p.name: p for p in personas}
        self.counters = metrics.ServerCounters()
        self.created = int(time.time())
        self.registry = metrics.registry(
            metrics.EngineCollector(client.stats, self.counters, lambda: client.model_name)
        )
        self._pump: EventPump | None = None

    @property
    def pump(self) -> EventPump:
        """The event pump into the server's loop (made on the first request, on that loop)."""
        if self._pump is None:
            self._pump = EventPump(asyncio.get_running_loop())
        return self._pump

    def model_ids(self) -> list[str]:
        return [self.client.model_name, *self.personas]

    def resolve(self, model: Any) -> tuple[str, Persona | None]:
        """The model id a request names (None: the base model) and its persona, if any."""
        if model is not None and not isinstance(model, str):
            raise bad_value("model", "a string (GET /v1/models lists them)", model)
        if model is None or model == self.client.model_name:
            return self.client.model_name, None
        if model in self.personas:
            return model, self.personas[model]
        raise ApiError(
            404,
            f"model {model!r} does not exist; GET /v1/models lists {', '.join(self.model_ids())}",
            "model",
        )

    def check(self, request: Request) -> None:
        """401 for a wrong or missing key (compared in constant time); 503 while the model
        loads or when it failed. (A keyless server's Host and content type: `HostGuard`.)"""
        if self.api_key is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, f"Bearer {self.api_key}".encode()):
                raise ApiError(
                    401,
                    "missing or wrong API key: send the header 'Authorization: "
                    "Bearer KEY' with the --api-key chatpage serve was given",
                )
        if not self.client.ready:
            if self.client.error is not None:
                raise ApiError(503, f"the model did not load: {self.client.error}")
            raise ApiError(503, f"the model is still loading ({self.client.status})")

    async def compile_grammar(self, api: ApiRequest, body: dict[str, Any]) -> None:
        """The request's grammar compiled (on the engine's grammar threads, never this loop),
        before it is submitted: the engine thread then never waits for it. A 400 naming the
        field when it does not compile, or not within `COMPILE_TIMEOUT_S`."""
        spec = api.params.structured
        if spec is None:
            return
        where = "tools" if api.tools.forced else structured_field(body)
        future = self.client.compile_grammar(spec)
        waited = asyncio.wrap_future(future)
        waited.add_done_callback(lambda f: f.cancelled() or f.exception())  # (read: no warning)
        try:
            await asyncio.wait_for(asyncio.shield(waited), COMPILE_TIMEOUT_S)
        except ValueError as e:
            raise ApiError(400, f"{where}: {e}", where) from None
        except TimeoutError:
            future.cancel()  # (still queued: nobody waits for it any more)
            raise ApiError(400, f"{where}: {too_slow(spec)}", where) from None
        except asyncio.CancelledError:
            if not waited.cancelled():  # this handler is cancelled, not the compile
                raise
            raise ApiError(400, f"{where}: {too_slow(spec)}", where) from None

    def force_tools(self, api: ApiRequest) -> None:
        """A tool_choice that forces a call becomes the grammar of the reply (the engine puts
        the tools into the prompt and reads the calls back)."""
        tools = api.tools
        if tools.offered and tools.forced:
            grammar = self.client.tool_grammar(tools.forced, tools.parallel)
            api.params = replace(api.params, structured=Structured(GrammarKind.GRAMMAR, grammar))


class HostGuard:
    """Before any route of a server with no API key: 403 for a Host that is not this server's
    and 415 for a body that is not JSON (`check_keyless`), so that a page whose name was
    rebound to this machine reads nothing, ``/health`` and ``/metrics`` included."""

    def __init__(self, app: ASGIApp, state: ServeState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.state.api_key is None:
            try:
                check_keyless(Request(scope), self.state.host)
            except ApiError as e:
                await _error(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _state(request: Request) -> ServeState:
    state: ServeState = request.app.state.serve
    return state


def _error(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def _until_disconnect(request: Request, work: Awaitable[T]) -> tuple[bool, T | None]:
    """Run ``work`` unless the client disconnects first: (finished, result)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait([task, watch], return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if task.done():
        return True, task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False, None


async def _prepare(request: Request, kind: str) -> tuple[ApiRequest, str]:
    state = _state(request)
    state.check(request)
    body = await read_json(request, state.limits)
    model, persona = state.resolve(body.get("model") if isinstance(body, dict) else None)
    vocab = state.client.vocab_size
    # off the loop: a request's JSON schemas are checked in Python (bounded, but not instant)
    api = await asyncio.to_thread(
        parse_request, body, kind, persona.sampling() if persona else None, vocab
    )
    if (
        persona is not None
        and kind == "chat"
        and not any(m["role"] == Role.SYSTEM for m in api.messages)
    ):
        # the persona's system prompt: its pinned prefix blocks serve this request
        api.messages.insert(0, {"role": str(Role.SYSTEM), "content": persona.system_prompt})
    state.force_tools(api)
    await state.compile_grammar(api, body)
    return api, model


async def generate(request: Request, kind: str) -> Response:
    try:
        api, model = await _prepare(request, kind)
    except ApiError as e:
        return _error(e)
    state = _state(request)
    stream = RequestStream(
        state.client, api, state.pump, api.tools.tools if api.tools.offered else None
    )
    rid = ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex
    writer = ChunkWriter(api, rid, model, int(time.time()), state.client.token_text)
    try:
        finished, first = await _until_disconnect(request, stream.first())
    except ApiError as e:
        return _error(e)
    if not finished or first is None:
        stream.cancel()
        return Response(status_code=499)
    if api.stream:
        return StreamingResponse(_sse(state, stream, writer, first), media_type="text/event-stream")

    async def collect() -> None:
        async for _ in stream.updates(first):
            pass

    finished, _ = await _until_disconnect(request, collect())
    if not finished or first is None:
        stream.cancel()
        return Response(status_code=499)
    _record(state, stream)
    if stream.error is not None:
        return _error(ApiError(500, stream.error))
    return JSONResponse(writer.whole(stream.outputs.values(), stream.usage))


async def _sse(
    state: ServeState, stream: RequestStream, writer: ChunkWriter, first: list[OutputDelta]
) -> AsyncIterator[str]:
    try:
        async for delta in stream.updates(first):
            for chunk in writer.chunks(delta):
                yield sse(chunk)
        if stream.error is not None:
            yield sse_error(stream.error)
        if stream.request.include_usage:
            yield sse(writer.usage_chunk(stream.usage))
        yield DONE
        _record(state, stream)
    finally:
        stream.cancel()  # the client went away mid-stream: free its blocks


def _record(state: ServeState, stream: RequestStream) -> None:
    reason = (
        stream.outputs[min(stream.outputs)].finish_reason if stream.outputs else FinishReason.ERROR
    )
    state.counters.record(
        stream.prompt_tokens, stream.completion_tokens, reason or FinishReason.STOP
    )


async def chat_completions(request: Request) -> Response:
    return await generate(request, "chat")


async def completions(request: Request) -> Response:
    return await generate(request, "completion")


async def models(request: Request) -> Response:
    state = _state(request)
    try:
        state.check(request)
    except ApiError as e:
        return _error(e)
    data = [
        {
            "id": mid,
            "object": "model",
            "created": state.created,
            "owned_by": OWNER,
            "root": state.client.model_name,
            "max_model_len": state.client.max_model_len,
        }
        for mid in state.model_ids()
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(request: Request) -> Response:
    client = _state(request).client
    if client.ready:
        return Response(status_code=200)
    text = f"the model did not load: {client.error}" if client.error else str(client.status)
    return JSONResponse({"status": text}, status_code=503)


async def version(request: Request) -> Response:
    try:
        number = importlib.metadata.version("chatpage")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        number = "unknown"
    return JSONResponse({"version": number, "server": OWNER})


async def stats(request: Request) -> Response:
    state = _state(request)
    try:
        state.check(request)
    except ApiError as e:
        return _error(e)
    snapshot = state.client.stats()
    if snapshot is None:
        return _error(ApiError(503, "the engine has no statistics yet"))
    counters = state.counters
    return JSONResponse(
        {
            **asdict(snapshot),
            "sharing_saving": snapshot.sharing_saving,
            "prompt_tokens_total": counters.prompt_tokens,
            "generation_tokens_total": counters.generation_tokens,
        }
    )


async def prometheus(request: Request) -> Response:
    return Response(metrics.render(_state(request).registry), media_type=metrics.CONTENT_TYPE)


def build_app(
    client: ServingClient,
    api_key: str | None = None,
    personas: list[Persona] | None = None,
    host: str = "127.0.0.1",
    limits: ServeLimits | None = None,
) -> Starlette:
    """The ASGI app over a started (or starting) ``client``, listening on ``host``; closing it
    is the caller's job. Shortens the process's GIL switch interval (`SWITCH_INTERVAL_S`)."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    state = ServeState(client, api_key, personas or [], host, limits)
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chatpage/stats", stats, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
        ],
        middleware=[Middleware(HostGuard, state=state)],
    )
    app.state.serve = state
    return app
