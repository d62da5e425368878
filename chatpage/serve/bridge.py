"""From the engine thread to a request handler: `EngineClient` events into an asyncio queue.

The engine calls ``on_event`` on its own thread; it only hands the event to the `EventPump`, which
wakes the server's loop once per burst (one engine step emits an event per running stream) and
puts each event in its request's queue there, so the engine never waits on HTTP. A handler reads
`OutputDelta`s: what changed per output index, with the final outputs all at once at the end (beam
search reorders beams until then, so its outputs are only read from there).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from chatpage.engine.client import EngineClient, StreamEvent
from chatpage.engine.outputs import OutputDelta
from chatpage.vocab import FinishReason
from chatpage.wire.errors import ApiError
from chatpage.wire.requests import ApiRequest


@dataclass
class Output:
    """One choice as the handler has sent it so far."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # per token, if asked
    finish_reason: FinishReason | None = None


class EventPump:
    """Engine thread -> event loop, one wake-up per burst of events instead of one per event."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._pending: deque[tuple[asyncio.Queue, StreamEvent]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, queue: asyncio.Queue, event: StreamEvent) -> None:
        """From any thread: ``event`` goes into ``queue`` on the loop soon."""
        with self._lock:
            self._pending.append((queue, event))
            if self._scheduled:
                return
            self._scheduled = True
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._pending = self._pending, deque()
            self._scheduled = False
        for queue, event in items:
            queue.put_nowait(event)


class RequestStream:
    """One submitted request; iterate `updates()`, then read `outputs`, `prompt_tokens`, ..."""

    def __init__(self, client: EngineClient, request: ApiRequest, pump: EventPump) -> None:
        self.client = client
        self.request = request
        self.outputs: dict[int, Output] = {}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.error: str | None = None
        self.done = False
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()

        def on_event(event: StreamEvent) -> None:  # the engine thread
            pump.post(self._queue, event)

        if request.kind == "chat":
            self.request_id = client.submit(request.messages, request.params, on_event,
                                            continue_reply=request.continue_final_message)
        else:
            self.request_id = client.submit_prompt(request.prompt, request.params, on_event)

    def cancel(self) -> None:
        """Stop the request in the engine (its blocks are freed on the engine's next turn)."""
        if not self.done:
            self.client.cancel(self.request_id)
            self.done = True

    async def first(self) -> list[OutputDelta]:
        """The first updates; raises `ApiError` 400 when the engine refused the request (too
        long a prompt, a KV cache too small), before anything was generated."""
        updates = await self._next()
        if self.error is not None and not any(o.token_ids or o.text for o in
                                              self.outputs.values()):
            raise ApiError(400 if self.client.error is None else 500, self.error)
        return updates

    async def updates(self, first: list[OutputDelta]) -> AsyncIterator[OutputDelta]:
        """``first`` (from `first()`), then every later update until the request is done."""
        for update in first:
            yield update
        while not self.done:
            for update in await self._next():
                yield update

    async def _next(self) -> list[OutputDelta]:
        """Wait for the next event; return the updates it makes (several once finished)."""
        event = await self._queue.get()
        self.prompt_tokens = event.prompt_tokens or self.prompt_tokens
        self.cached_tokens = event.prefix_hit_tokens or self.cached_tokens
        if event.error:
            self.error = event.error
        if not event.request_finished:
            if self.request.beam:
                return []
            return [u for u in [self._apply(event)] if u is not None]
        finals = [event]
        while len(finals) < event.num_outputs:
            finals.append(await self._queue.get())
        self.done = True
        if self.request.beam:
            self.outputs.clear()  # the final beams replace the live ones
        return [u for u in map(self._apply, finals) if u is not None]

    def _apply(self, event: StreamEvent) -> OutputDelta | None:
        out = self.outputs.setdefault(event.index, Output(event.index))
        if out.finish_reason is not None:
            return None
        ids = event.token_ids or []
        lps = event.logprobs or []
        tops = event.top_logprobs or []
        new_ids, new_lps = ids[len(out.token_ids):], lps[len(out.logprobs):]
        new_tops = tops[len(out.top_logprobs):]
        delta = event.text[len(out.text):] if event.text.startswith(out.text) else ""
        out.text = event.text if delta or event.text == out.text else out.text
        # each event carries fresh lists (the engine slices them per output): keep, not copy
        out.token_ids, out.logprobs = ids or out.token_ids, lps or out.logprobs
        out.top_logprobs = tops or out.top_logprobs
        if event.finished:
            out.finish_reason = FinishReason(event.finish_reason or FinishReason.STOP)
        if not delta and not new_ids and not event.finished:
            return None
        asked = self.request.logprobs
        return OutputDelta(event.index, delta, tuple(new_ids),
                           tuple(new_lps) if asked else None, tuple(new_tops) if asked else None,
                           out.finish_reason)

    @property
    def completion_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs.values())
