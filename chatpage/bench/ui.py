"""`chatpage bench ui`: start-up and responsiveness of the TUI while many sessions stream.

Runs the real app headless (Textual's test driver) over the real engine and reports:
time to first paint and to model-ready (cold: empty cache dir, so the model is dequantized and
the kernels built; cached: the usual start), keystroke-to-screen latency percentiles while
``--sessions`` chats stream at once, and the engine's aggregate tokens/s meanwhile. With one
session it also runs the same request, with the same sampling (the persona's), on an engine of
the same model and config with no UI (on this thread with the engine's thread count, after the
app has closed), timed over the same tokens
of the reply as each window in the TUI: ``engine_alone_tok_s`` against the rate inside the TUI
while it only streams (``tui_tok_s``, a window with no input), ``engine_alone_typing_tok_s``
against the rate while keys are typed and timed (``tui_typing_tok_s``). ``ui_thread_cpu_share``
is the CPU time the app's thread used in the streaming window over its length (what the UI
takes from the engine through the GIL).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from chatpage.bench.reporting import Goal, Section, at_least, at_most, reader
from chatpage.vocab import WEIGHT_FORMATS

STORY = "Write a long story about a lighthouse keeper."
STREAM_WINDOW_S = 4.0  # streaming with no input, before the keys
GOAL_TUI_VS_ENGINE_ALONE = 0.9  # one chat's tok/s in the TUI over the engine's alone
GOAL_MODEL_READY_S = 3.0  # a cached start, from process start to the engine ready


def _since_process_start() -> float:
    """Seconds since this process started (Linux /proc; interpreter start-up included)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return uptime - start_ticks / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(args) -> dict:
    from chatpage.config.settings import load_settings
    from chatpage.engine.client import LocalEngineClient
    from chatpage.engine.config import EngineConfig
    from chatpage.ui.app import ChatApp

    settings, _ = load_settings(overrides={"model": args.model, "weights": args.weights})
    config = EngineConfig.for_settings(settings, args.threads)
    app = ChatApp(model=settings.model, config=config, settings=settings)
    async with app.run_test(headless=True, size=(160, 48)) as pilot:
        painted = asyncio.Event()
        app.call_after_refresh(painted.set)
        await painted.wait()
        first_paint = _since_process_start()
        while not app.client.ready:
            if app.client.error:
                raise SystemExit(f"chatpage: error: {app.client.error}")
            await asyncio.sleep(0.05)
        model_ready = _since_process_start()
        print(f"first paint {first_paint:.2f}s, model ready {model_ready:.2f}s", file=sys.stderr)
        start = {
            "bench": "ui",
            "model": settings.model or "default",
            "cold": args.cold,
            "first_paint_s": round(first_paint, 3),
            "model_ready_s": round(model_ready, 3),
            "weights": config.weight_dtype,
            "threads": config.threads,
        }
        if args.startup_only:
            return start

        await _open_sessions(app, args.sessions, args.max_tokens)
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.pause()
        client = app.client
        if not isinstance(client, LocalEngineClient) or client.engine is None:
            raise SystemExit("chatpage: error: bench ui measures the local engine")
        engine = client.engine
        await _until_all_decode(client, args.sessions)
        current = app.chat.current
        if current is None:
            raise SystemExit("chatpage: error: no chat is on show")
        reply = current.entries[-1]
        # the request's own sampling (the persona's): engine alone runs it the same way
        params = next(iter(list(engine.groups.values()))).params

        def shown() -> int:  # the current reply's tokens so far (one session: the only reply)
            return reply.stats.tokens if reply.stats is not None else 0

        stream_tok_s, stream_span, ui_cpu_share = await _stream_window(engine, shown)
        generated0, t_start = engine.num_generated, time.perf_counter()
        typing_span = [shown(), 0]
        latencies = await _time_keys(app, client, args.keys, args.sessions)
        elapsed = time.perf_counter() - t_start
        tok_s = (engine.num_generated - generated0) / elapsed
        typing_span[1] = shown()
        stats = client.stats()
        running = stats.num_running if stats is not None else 0
        system = current.persona.system_prompt if args.sessions == 1 else None
    alone = {}
    if system is not None:
        alone = _engine_alone(
            settings.model,
            config,
            system,
            params,
            args.max_tokens,
            {"engine_alone_tok_s": stream_span, "engine_alone_typing_tok_s": typing_span},
        )
    return {
        **start,
        "sessions": args.sessions,
        "running_at_end": running,
        "keystrokes": len(latencies),
        "keystroke_p50_ms": round(statistics.median(latencies), 2),
        "keystroke_p99_ms": round(_percentile(latencies, 0.99), 2),
        "aggregate_tok_s": round(tok_s, 1),
        **(
            {
                "tui_tok_s": round(stream_tok_s, 1),
                "ui_thread_cpu_share": round(ui_cpu_share, 3),
                "tui_typing_tok_s": round(tok_s, 1),
                **alone,
                **_ratio("tui_vs_engine_alone", stream_tok_s, alone.get("engine_alone_tok_s")),
                **_ratio(
                    "tui_typing_vs_engine_alone", tok_s, alone.get("engine_alone_typing_tok_s")
                ),
                "goal_tui_vs_engine_alone": GOAL_TUI_VS_ENGINE_ALONE,
            }
            if alone
            else {}
        ),
    }


async def _open_sessions(app, sessions: int, max_tokens: int) -> None:
    """Open ``sessions`` chats in all (the personas in turn) and ask each for the story."""
    personas = app.personas
    for i in range(sessions - 1):
        await app.chat.open_session(personas[i % len(personas)])
    for session in list(app.chats.sessions):
        app.chat.current = session
        await app.chat.submit_prompt(f"/max {max_tokens}")
        await app.chat.submit_prompt(STORY)


async def _until_all_decode(client, sessions: int) -> None:
    """Wait until every session decodes: persona pins and prompts are prefilled first (on one
    thread the nine personas' pins alone take seconds of prefill), and are not measured."""
    engine = client.engine
    while True:
        stats = client.stats()
        if stats is not None and engine.num_generated:
            if (
                stats.num_running >= sessions
                and not stats.num_waiting
                and engine.num_generated >= 2 * sessions
            ):
                return
            if not stats.num_running + stats.num_waiting:
                raise SystemExit(
                    "chatpage: error: the replies ended before the measurement "
                    "began; raise --max-tokens"
                )
        await asyncio.sleep(0.1)


async def _stream_window(engine, shown: Callable[[], int]) -> tuple[float, list[int], float]:
    """Stream with no input for :data:`STREAM_WINDOW_S`: the engine's tok/s, the span of the
    reply's tokens it covered, and the share of the window this (the app's) thread was on a CPU:
    what the UI costs the engine."""
    generated0, t_start = engine.num_generated, time.perf_counter()
    span = [shown(), 0]
    ui_cpu0 = time.thread_time()
    await asyncio.sleep(STREAM_WINDOW_S)
    window = time.perf_counter() - t_start
    tok_s = (engine.num_generated - generated0) / window
    span[1] = shown()
    return tok_s, span, (time.thread_time() - ui_cpu0) / window


async def _time_keys(app, client, keys: int, sessions: int) -> list[float]:
    """Type ``keys`` keys into the prompt, 0.1 s apart, while the replies stream: each one's
    milliseconds from posting to the screen refreshed with it (until a reply ends)."""
    from textual import events

    prompt = app.chat.prompt
    latencies = []
    for i in range(keys):
        before = prompt.text
        refreshed = asyncio.Event()
        t = time.perf_counter()
        prompt.post_message(events.Key("x", "x"))
        while prompt.text == before:  # 1 ms polls: do not starve the engine thread
            await asyncio.sleep(0.001)
        app.call_after_refresh(refreshed.set)
        await refreshed.wait()
        latencies.append((time.perf_counter() - t) * 1e3)
        if i % 10 == 9:
            print(f"{i + 1}/{keys} keys", file=sys.stderr)
        stats = client.stats()
        if stats is not None and stats.num_running < sessions:  # a reply ended: stop
            break
        await asyncio.sleep(0.1)
    return latencies


def _ratio(name: str, tui: float, alone: float | None) -> dict:
    """``{name: tui / alone}``, or nothing where the window held no tokens to compare."""
    return {name: round(tui / alone, 3)} if alone else {}


def _engine_alone(
    model: str | None, config, system: str, params, max_tokens: int, spans: dict[str, list[int]]
) -> dict:
    """The TUI's request again, on a fresh engine stepped here without a UI, with the same
    sampling (``params``; EOS ignored, so it lasts): for each named span [first, last) of the
    reply's tokens, the decode rate (wall clock) over those same tokens (a step costs more as the
    context grows, so the TUI's windows are compared token for token)."""
    import dataclasses

    import torch

    from chatpage.engine import LLMEngine
    from chatpage.engine.text.chat_template import render_prompt

    torch.set_num_threads(config.threads)
    engine = LLMEngine.from_pretrained(model, config, progress=lambda _m: None)
    ids = render_prompt(
        engine.tokenizer,
        [{"role": "system", "content": system}, {"role": "user", "content": STORY}],
    )
    engine.add_request(ids, dataclasses.replace(params, max_tokens=max_tokens, ignore_eos=True))
    base = engine.num_generated
    times: dict[int, float] = {}  # reply tokens generated -> when
    wanted = {n for span in spans.values() for n in span}
    while engine.has_unfinished() and len(times) < len(wanted):
        done = engine.num_generated - base
        if done in wanted:
            times[done] = time.perf_counter()
        engine.step()
    if engine.num_generated - base in wanted:
        times[engine.num_generated - base] = time.perf_counter()
    return {
        name: round((last - first) / (times[last] - times[first]), 1)
        for name, (first, last) in spans.items()
        if last > first and first in times and last in times
    }  # (a reply that ended early)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chatpage bench ui", description=__doc__)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON line (default: readable text)",
    )
    parser.add_argument("--model", help="model directory or .gguf (default: the default model)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--keys", type=int, default=60, help="keystrokes to time")
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--weights", choices=WEIGHT_FORMATS, help="weight format (default: int4)")
    parser.add_argument(
        "--threads", type=int, default=None, help="engine threads (default: every core)"
    )
    parser.add_argument(
        "--cold",
        action="store_true",
        help="start with an empty cache dir (dequantize + build kernels)",
    )
    parser.add_argument(
        "--startup-only",
        action="store_true",
        help="stop at model ready: first paint and model ready only",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_DATA_HOME"] = os.path.join(tmp, "data")  # no sessions restored
        if args.cold:
            os.environ["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
        result = asyncio.run(_measure(args))
    from chatpage.bench import common  # after measuring: its imports must not shift start-up

    return common.emit(result, args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class UiResult:
    """What the report reads of a run's JSON; the one-chat figures where one chat ran."""

    weights: str
    threads: int
    first_paint_s: float
    model_ready_s: float
    keystroke_p50_ms: float | None = None
    keystroke_p99_ms: float | None = None
    tui_tok_s: float | None = None
    tui_typing_tok_s: float | None = None
    engine_alone_tok_s: float | None = None
    tui_vs_engine_alone: float | None = None
    tui_typing_vs_engine_alone: float | None = None


def goals(u: UiResult) -> list[Goal]:
    ratio = u.tui_vs_engine_alone
    if u.tui_tok_s is None or ratio is None:
        return []
    return [
        at_least(
            "ui",
            "one chat: tok/s in the TUI / engine alone",
            ratio,
            GOAL_TUI_VS_ENGINE_ALONE,
            f"{u.tui_tok_s:.1f} tok/s streamed in the TUI (redrawing at most 10 times a second "
            f"per pane, no input) against {u.engine_alone_tok_s:.1f} for the same request with "
            f"no UI, {u.threads} engine thread(s); while keys are typed and timed: "
            f"{u.tui_typing_tok_s:.1f} tok/s ({u.tui_typing_vs_engine_alone:.2f})",
        ),
        at_most(
            "ui",
            "cached start to model ready",
            u.model_ready_s,
            GOAL_MODEL_READY_S,
            f"from process start (interpreter, imports, Textual's first "
            f"paint at {u.first_paint_s:.2f} s) to the engine ready, {u.weights} weights "
            "read from the packed cache",
            unit=" s",
        ),
    ]


def figures(r: UiResult) -> list[str]:
    return [
        f"One chat in the TUI ({r.weights} weights, {r.threads} engine thread(s)): "
        f"{r.tui_tok_s:.1f} tok/s streaming, {r.tui_typing_tok_s:.1f} while typing, "
        f"{r.engine_alone_tok_s:.1f} with no UI (**{r.tui_vs_engine_alone:.2f}**, "
        f"{r.tui_typing_vs_engine_alone:.2f} typing); keystroke to screen p50 "
        f"{r.keystroke_p50_ms:.1f} ms, p99 {r.keystroke_p99_ms:.1f} ms; first paint "
        f"{r.first_paint_s:.2f} s, model ready {r.model_ready_s:.2f} s."
    ]


# one chat, long enough to outlast the keys
SECTION = Section(
    reader(UiResult), goals, figures, args=("--sessions", "1", "--max-tokens", "1500")
)


if __name__ == "__main__":
    sys.exit(main())
