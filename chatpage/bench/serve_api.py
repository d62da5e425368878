"""`chatpage bench serve --api`: the serving workload through `chatpage serve`'s HTTP API.

``--concurrency`` requests of the trace (default 32) start at once, twice on one
`LocalEngineClient`: first in-process (callbacks into an asyncio queue, what the server's
handlers read), then as
streaming HTTP clients of the real server (uvicorn on a free local port, in this process).
Both runs report the request rate (requests over the makespan, wall clock), TTFT p50/p99 and
TPOT p50. The API's cost is timed per streamed token, from the engine thread emitting a token to
the HTTP client holding the chunk that carries it (one process, one clock):

* ``api_overhead_ms``: per streamed token, amortized. One engine step emits a token for every
  running stream at once; the API takes from the first emit to the last chunk received to pass
  that burst on. The sum of those spans over the tokens streamed is the goal figure (<= 1 ms at
  32 concurrent streams).
* ``api_latency_p50_ms`` / ``_p99_ms``: how long one token waits (a token at the end of a burst
  waits for the chunks ahead of it).

The HTTP client runs in this process too, so its CPU use counts against the server here: an upper
bound of what a remote client sees.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
from collections import defaultdict
from typing import cast

from chatpage.bench import common
from chatpage.bench.workloads import BenchRequest
from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.client import LocalEngineClient, RequestUpdate, UpdateCallback

GOAL_OVERHEAD_MS = 1.0
BURST_GAP_S = 0.002  # emits further apart than this come from different engine steps


class TimedClient:
    """A `LocalEngineClient` whose tokens are time-stamped per prompt as the engine emits them."""

    def __init__(self, client: LocalEngineClient) -> None:
        self._client = client
        self.emitted: dict[tuple[int, ...], list[float]] = defaultdict(list)

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def submit_prompt(self, prompt, params: SamplingParams, on_update: UpdateCallback) -> str:
        stamps = self.emitted[tuple(prompt)]

        def timed(update: RequestUpdate) -> None:
            now = time.perf_counter()
            stamps.extend(now for d in update.outputs for _ in range(d.num_tokens))
            on_update(update)

        return self._client.submit_prompt(prompt, params, timed)


def _params(r: BenchRequest) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)


def _figures(times: list[tuple[float, float, float]], outputs: list[int]) -> dict:
    """Latency figures of requests timed as (start, first token, end)."""
    starts, firsts, ends = ([t[i] for t in times] for i in range(3))
    ttft = [f - s for s, f in zip(starts, firsts, strict=True)]
    tpot = [(e - f) / (n - 1) for f, e, n in zip(firsts, ends, outputs, strict=True) if n > 1]
    return {
        "rate": len(starts) / (max(ends) - min(starts)),
        "ttft_p50": common.percentile(ttft, 50),
        "ttft_p99": common.percentile(ttft, 99),
        "tpot_p50": common.percentile(tpot, 50),
    }


async def in_process(client: LocalEngineClient, trace: list[BenchRequest]) -> dict:
    loop = asyncio.get_running_loop()

    async def one(r: BenchRequest) -> tuple[float, float, float]:
        queue: asyncio.Queue[RequestUpdate] = asyncio.Queue()
        start = time.perf_counter()

        def on_update(update: RequestUpdate) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, update)

        client.submit_prompt(r.prompt_ids, _params(r), on_update)
        first = None
        while not (update := await queue.get()).finished:
            if first is None and update.usage.completion_tokens:
                first = time.perf_counter()
        return start, first or time.perf_counter(), time.perf_counter()

    got = await asyncio.gather(*(one(r) for r in trace))
    return _figures(got, [r.output_len for r in trace])


async def over_http(url: str, timed: TimedClient, trace: list[BenchRequest]) -> dict:
    import httpx

    pairs: list[tuple[float, float]] = []  # (emitted, received) per token

    async def one(http: httpx.AsyncClient, r: BenchRequest) -> tuple[float, float, float]:
        body = {
            "prompt": r.prompt_ids,
            "stream": True,
            "temperature": 0,
            "ignore_eos": True,
            "max_tokens": r.output_len,
        }
        stamps = timed.emitted[tuple(r.prompt_ids)]
        start, first, seen = time.perf_counter(), None, 0
        async with http.stream("POST", "/v1/completions", json=body) as s:
            async for line in s.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                # one engine step adds one token to a stream, which the server sends as one
                # chunk (an empty text included): chunk k carries token k
                now = time.perf_counter()
                first = first or now
                if seen < len(stamps):
                    pairs.append((stamps[seen], now))
                seen += 1
        return start, first or time.perf_counter(), time.perf_counter()

    limits = httpx.Limits(max_connections=len(trace) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        got = await asyncio.gather(*(one(http, r) for r in trace))
    result = _figures(got, [r.output_len for r in trace])
    waits = [received - emitted for emitted, received in pairs]
    result["api_overhead_ms"] = sum(_burst_spans(pairs)) / len(pairs) * 1000
    result["api_latency_p50_ms"] = statistics.median(waits) * 1000
    result["api_latency_p99_ms"] = common.percentile(waits, 99) * 1000
    result["streamed_tokens"] = len(pairs)
    return result


def _burst_spans(pairs: list[tuple[float, float]]) -> list[float]:
    """First emit to last receipt of each engine step's tokens (grouped by their emit times)."""
    spans: list[float] = []
    start: float | None = None
    last_emit = last_receipt = 0.0
    for emitted, received in sorted(pairs):
        if start is not None and emitted - last_emit > BURST_GAP_S:
            spans.append(last_receipt - start)
            start = None
        if start is None:
            start, last_receipt = emitted, received
        last_emit = emitted
        last_receipt = max(last_receipt, received)
    if start is not None:
        spans.append(last_receipt - start)
    return spans


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(model: str | None, trace: list[BenchRequest], kv_cache_bytes: int) -> dict:
    """Both runs of ``trace`` (all requests at once) on one engine; the JSON fields."""
    import uvicorn

    from chatpage.serve import build_app

    # no prefix cache: the second run sends the same prompts and would skip their prefill
    client = LocalEngineClient(
        model, EngineConfig(kv_cache_bytes=kv_cache_bytes, enable_prefix_caching=False)
    )
    client.start(lambda msg: common.say(f"engine: {msg}"))
    if not client.wait_ready():
        raise SystemExit(f"chatpage bench serve --api: the model did not load: {client.error}")
    timed = TimedClient(client)
    # (a TimedClient forwards all but submit_prompt to the LocalEngineClient it wraps)
    app = build_app(cast(LocalEngineClient, timed))  # sets the GIL switch interval for both runs
    warm = trace[0]
    asyncio.run(in_process(client, [BenchRequest(warm.prompt_ids[:8], 2)]))
    common.say(f"in-process: {len(trace)} concurrent requests")
    local = asyncio.run(in_process(client, trace))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="bench-uvicorn", daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        common.say(f"HTTP: {len(trace)} concurrent streams")
        api = asyncio.run(over_http(f"http://127.0.0.1:{port}", timed, trace))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        client.close()
    return {
        "concurrency": len(trace),
        "in_process": local,
        "api": api,
        "api_overhead_ms": api["api_overhead_ms"],
        "goal_api_overhead_ms": GOAL_OVERHEAD_MS,
    }
