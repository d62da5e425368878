"""`chatpage bench serve --api`: the serving workload through `chatpage serve`'s HTTP API.

``--concurrency`` requests of the trace (default 32; ``make bench`` runs 64, each decoding
``--output-tokens``, so that every step streams a token to every stream) start at once, twice on
one `LocalEngineClient` (same prompts, greedy, EOS ignored, no prefix cache, the engine on
``--threads``): first in-process (callbacks into an asyncio queue, what the server's handlers
read), then as streaming HTTP clients (httpx) of the real server (uvicorn on a free local port, in
this process, after one short request to warm it). Both runs report the request rate (requests
over the makespan, wall clock), TTFT p50/p99 and TPOT p50.

The goal figure, ``api_overhead_ms``, is what serving over HTTP adds per streamed token, against
the in-process run of the same requests: the CPU time the process spent over each run outside
the engine's steps and the reader, HTTP minus in-process, over the tokens streamed. The reader is
the thread that reads the tokens (the in-process consumer, or the HTTP client, a remote program in
real use); the engine's steps are the engine thread's CPU time less its callbacks into the reader
or the server, which are serving work and count. So the server's event loop, the callbacks and
anything else serving runs count, and the steps, which are the same work in both runs, do not:
their CPU time alone drifts by a few percent between two runs (more than 1 ms a token at 64
rows) on a shared machine. CPU time because serving is several threads: their wall times overlap
on two cores and stretch whenever another process runs, while CPU time adds up what each thread
spent. That is the clock of the other benchmarks on one torch thread (`common.now`); with more
threads (``--threads`` > 1) the OpenMP workers spin in CPU time, so the figure is then the
wall-clock difference of the two makespans, client included. What the CPU figure leaves out is
what serving costs the steps themselves (the engine thread waiting for the GIL, caches shared
with the server): that shows in the wall-clock figures, on a quiet machine only.
Also reported:

* ``server_thread_ms`` / ``client_ms``: the CPU time per streamed token of the server's loop
  thread alone, and of the HTTP client;
* ``wall_added_ms``: the makespans' difference per streamed token (wall clock: the in-process
  client's GIL share included, and whatever else the machine ran);
* ``api_latency_p50_ms`` / ``_p99_ms``: from the engine thread emitting a token to the HTTP
  client holding the chunk that carries it (wall clock; a token at the end of a step's burst
  waits for the chunks ahead of it).
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar, cast

import torch

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, reader, table
from chatpage.bench.workloads import BenchRequest
from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.client import LocalEngineClient, RequestUpdate, UpdateCallback

GOAL_OVERHEAD_MS = 1.0
T = TypeVar("T")


class TimedClient:
    """A `LocalEngineClient` whose tokens are time-stamped per prompt as the engine emits them."""

    def __init__(self, client: LocalEngineClient) -> None:
        self._client = client
        self.emitted: dict[tuple[int, ...], list[float]] = defaultdict(list)
        self.callbacks_cpu_s = 0.0  # the engine thread's time in the callbacks
        self.engine_thread: int | None = None  # its id (known from the first callback)

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def submit_prompt(
        self, prompt, params: SamplingParams, on_update: UpdateCallback, add_special_tokens=True
    ) -> str:
        stamps = self.emitted[tuple(prompt)]

        def timed(update: RequestUpdate) -> None:
            cpu, now = time.thread_time(), time.perf_counter()
            self.engine_thread = threading.get_ident()
            stamps.extend(now for d in update.outputs for _ in range(d.num_tokens))
            on_update(update)
            self.callbacks_cpu_s += time.thread_time() - cpu

        return self._client.submit_prompt(prompt, params, timed, add_special_tokens)


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


def _spent(run: Callable[[], T], timed: TimedClient) -> tuple[T, dict]:
    """``run()`` on this thread, and what it took: wall seconds, CPU seconds of the process, of
    this thread (the reader's: the run's event loop is on this thread), of the engine thread and
    of its callbacks, and the serving work's (see the module's docstring)."""
    assert timed.engine_thread is not None, "no warm-up run through the TimedClient"
    engine = time.pthread_getcpuclockid(timed.engine_thread)
    clocks = (
        time.perf_counter,
        time.process_time,
        time.thread_time,
        lambda: time.clock_gettime(engine),
        lambda: timed.callbacks_cpu_s,
    )
    before = [clock() for clock in clocks]
    result = run()
    wall, cpu, reader, steps, callbacks = (c() - b for c, b in zip(clocks, before, strict=True))
    return result, {
        "wall_s": wall,
        "process_cpu_s": cpu,
        "reader_cpu_s": reader,
        "engine_thread_cpu_s": steps,
        "callbacks_cpu_s": callbacks,
        "serving_cpu_s": cpu - reader - steps + callbacks,
    }


def _thread_cpu(thread: threading.Thread) -> float:
    """CPU seconds ``thread`` (alive) has spent so far."""
    assert thread.ident is not None
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


async def in_process(client: TimedClient, trace: list[BenchRequest]) -> dict:
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
    result["api_latency_p50_ms"] = statistics.median(waits) * 1000
    result["api_latency_p99_ms"] = common.percentile(waits, 99) * 1000
    result["streamed_tokens"] = len(pairs)
    return result


def overhead(local: dict, api: dict, server_cpu_s: float, tokens: int) -> dict:
    """The per-streamed-token figures (ms) of the two runs' costs (see the module's docstring)."""
    serving = api["serving_cpu_s"] - local["serving_cpu_s"]
    wall = api["wall_s"] - local["wall_s"]
    per_token = 1000 / tokens
    return {
        "api_overhead_ms": (serving if common.clock_name() == "cpu" else wall) * per_token,
        "server_thread_ms": server_cpu_s * per_token,
        "client_ms": api["reader_cpu_s"] * per_token,
        "wall_added_ms": wall * per_token,
    }


def run(model: str | None, trace: list[BenchRequest], kv_cache_bytes: int) -> dict:
    """Both runs of ``trace`` (all requests at once) on one engine; the JSON fields."""
    from chatpage.serve import build_app
    from chatpage.serve.threaded import serving

    # no prefix cache: the second run sends the same prompts and would skip their prefill
    config = EngineConfig(
        kv_cache_bytes=kv_cache_bytes,
        enable_prefix_caching=False,
        num_threads=torch.get_num_threads(),  # --threads (the engine thread sets its own)
        device=common.DEVICE,
        dtype="auto",
    )
    client = LocalEngineClient(model, config)
    client.start(lambda msg: common.say(f"engine: {msg}"))
    try:
        if not client.wait_ready():
            raise SystemExit(f"chatpage bench serve --api: the model did not load: {client.error}")
        timed = TimedClient(client)
        # (a TimedClient forwards all but submit_prompt to the LocalEngineClient it wraps)
        app = build_app(cast(LocalEngineClient, timed))  # the GIL switch interval of both runs
        warm = [BenchRequest(trace[0].prompt_ids[:8], 2)]
        asyncio.run(in_process(timed, warm))
        common.say(f"in-process: {len(trace)} concurrent requests")
        # (through the TimedClient too, so that both runs pay for its time stamps)
        local, local_cost = _spent(lambda: asyncio.run(in_process(timed, trace)), timed)
        with serving(app) as server:
            asyncio.run(over_http(server.url, timed, warm))
            timed.emitted.clear()
            common.say(f"HTTP: {len(trace)} concurrent streams")
            server_cpu = _thread_cpu(server.thread)
            api, api_cost = _spent(lambda: asyncio.run(over_http(server.url, timed, trace)), timed)
            server_cpu = _thread_cpu(server.thread) - server_cpu
    finally:
        client.close()
    figures = overhead(local_cost, api_cost, server_cpu, api["streamed_tokens"])
    return {
        "concurrency": len(trace),
        "in_process": {**local, **local_cost},
        "api": {**api, **api_cost},
        **figures,
        "goal_api_overhead_ms": GOAL_OVERHEAD_MS,
    }


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunFigures:
    """One of the two runs (in-process, over HTTP)."""

    rate: float
    ttft_p50: float
    ttft_p99: float
    tpot_p50: float
    wall_s: float
    engine_thread_cpu_s: float


@dataclass(frozen=True)
class HttpFigures(RunFigures):
    api_latency_p50_ms: float
    api_latency_p99_ms: float
    streamed_tokens: int


@dataclass(frozen=True)
class ServeApiResult:
    """What the report reads of a run's JSON; its goal as the run recorded it."""

    concurrency: int
    workload: str
    mean_input: float
    mean_output: float
    clock: str
    in_process: RunFigures
    api: HttpFigures
    api_overhead_ms: float
    server_thread_ms: float
    client_ms: float
    wall_added_ms: float
    goal_api_overhead_ms: float


def goals(a: ServeApiResult) -> list[Goal]:
    v, goal = a.api_overhead_ms, a.goal_api_overhead_ms
    what = f"serve overhead per streamed token at {a.concurrency} streams, ms"
    return [Goal("serve_api", what, v, f"<= {goal:g}", v <= goal, _why(a))]


def _why(a: ServeApiResult) -> str:
    local, api = a.in_process, a.api
    return (
        f"{api.streamed_tokens} tokens streamed at once to {a.concurrency} httpx clients "
        f"of the real server ({a.mean_output:.0f} each), against the same requests read "
        f"in-process from the same engine, by {a.clock} time of everything but the engine's "
        f"steps and the reader: the server's loop thread spent {a.server_thread_ms:.3f} ms a "
        f"token, the client {a.client_ms:.3f} (not counted); the steps, left out, took "
        f"{local.engine_thread_cpu_s:.1f} s of CPU in-process and "
        f"{api.engine_thread_cpu_s:.1f} s over HTTP (two runs' steps drift by ~10% on this "
        "shared machine, more than the goal)"
        f"; wall clock, the makespan grew by {a.wall_added_ms:.2f} ms a token (TPOT p50 "
        f"{api.tpot_p50 * 1e3:.0f} against {local.tpot_p50 * 1e3:.0f} ms) and a token "
        f"reached its client {api.api_latency_p50_ms:.1f} ms after the engine emitted it "
        f"(p99 {api.api_latency_p99_ms:.1f})"
    )


def figures(r: ServeApiResult) -> list[str]:
    rows = [
        [label, x.rate, x.ttft_p50, x.ttft_p99, 1e3 * x.tpot_p50, x.wall_s]
        for label, x in (("in-process", r.in_process), ("HTTP", r.api))
    ]
    header = ["run", "rate (req/s)", "TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (ms)", "wall (s)"]
    return [
        f"{r.concurrency} {r.workload}-shaped requests at once (mean input "
        f"{r.mean_input}, {r.mean_output} output tokens each), streamed through "
        "`chatpage serve` to httpx clients, and read in-process from the same engine.",
        "",
        table(header, rows),
        "",
        f"Per streamed token: serving adds **{r.api_overhead_ms:.3f} ms** "
        f"({r.clock} clock), the server's loop thread {r.server_thread_ms:.3f} ms, "
        f"the client {r.client_ms:.3f} ms; emitted to received p50 "
        f"{r.api.api_latency_p50_ms:.1f} ms, p99 {r.api.api_latency_p99_ms:.1f} ms.",
    ]


# the 64 streams, all decoding together from start to end
SECTION = Section(
    reader(ServeApiResult),
    goals,
    figures,
    args=("--concurrency", "64", "--output-tokens", "32"),
    command=("serve", "--api"),
)
