"""From the engine thread to a request handler: `EngineClient` updates into an asyncio queue.

The engine calls ``on_update`` on its own thread; it only hands the update to the `EventPump`,
which wakes the server's loop once per burst (one engine step sends an update per running
request) and puts each in its request's queue there, so the engine never waits on HTTP. A
handler reads the `OutputDelta`s as they come, and the outputs folded from them (beam search
reorders beams until the end, so its outputs are only sent from its final update).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import CompletionOutput, OutputDelta, RequestUpdate, Usage
from chatpage.engine.protocol import ChatRequest, ServingClient
from chatpage.wire.errors import ApiError
from chatpage.wire.requests import ApiRequest


class EventPump:
    """Engine thread -> event loop, one wake-up per burst of updates instead of one per update."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: deque[tuple[asyncio.Queue[RequestUpdate], RequestUpdate]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, queue: asyncio.Queue[RequestUpdate], update: RequestUpdate) -> None:
        """From any thread: ``update`` goes into ``queue`` on the loop soon."""
        with self._lock:
            self._pending.append((queue, update))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._pending = self._pending, deque()
            self._scheduled = False
        for queue, update in items:
            queue.put_nowait(update)


class RequestStream:
    """One submitted request; iterate `updates()`, then read `outputs`, `usage`, `error`.
    ``tools``: function tools the reply may call (the engine offers them the model's way and
    reads its calls)."""

    def __init__(
        self,
        client: ServingClient,
        request: ApiRequest,
        pump: EventPump,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.client = client
        self.request = request
        self.usage = Usage()
        self.error: str | None = None
        self.done = False
        self._queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        self._fold = OutputAccumulator()
        self._outputs: list[CompletionOutput] = []

        def on_update(update: RequestUpdate) -> None:  # the engine thread
            pump.post(self._queue, update)

        if request.kind == "chat":
            chat = ChatRequest(
                request.messages,
                request.params,
                continue_reply=request.continue_final_message,
                tools=tools,
                add_special_tokens=request.add_special_tokens,
            )
            self.request_id = client.submit(chat, on_update)
        else:
            self.request_id = client.submit_prompt(
                request.prompt, request.params, on_update, request.add_special_tokens
            )

    @property
    def outputs(self) -> dict[int, CompletionOutput]:
        """Each choice as sent so far, by index (complete once `done`)."""
        return {o.index: o for o in self._outputs}

    def cancel(self) -> None:
        """Stop the request in the engine (its blocks are freed on the engine's next turn)."""
        if not self.done:
            self.client.cancel(self.request_id)
            self.done = True

    async def first(self) -> list[OutputDelta]:
        """The first deltas; raises `ApiError` 400 when the engine refused the request (too
        long a prompt, a KV cache too small), before anything was generated."""
        deltas = await self._next()
        while not deltas and not self.done and not self.request.beam:  # prefill chunks: no text
            deltas = await self._next()
        if self.error is not None and not any(o.token_ids or o.text for o in self._outputs):
            raise ApiError(400 if self.client.error is None else 500, self.error)
        return deltas

    async def updates(self, first: list[OutputDelta]) -> AsyncIterator[OutputDelta]:
        """``first`` (from `first()`), then every later delta until the request is done."""
        for delta in first:
            yield delta
        while not self.done:
            for delta in await self._next():
                yield delta

    async def _next(self) -> list[OutputDelta]:
        """Wait for the next update; return the deltas to send of it."""
        update = await self._queue.get()
        self._outputs = self._fold.add(update).outputs
        if update.usage.prompt_tokens:  # (a failure the engine never saw counts nothing)
            self.usage = update.usage
        if update.error:
            self.error = update.error
        if update.finished:
            self.done = True
        elif self.request.beam:
            return []
        return list(update.outputs)

    @property
    def prompt_tokens(self) -> int:
        return self.usage.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self.usage.cached_tokens

    @property
    def completion_tokens(self) -> int:
        return self.usage.completion_tokens
