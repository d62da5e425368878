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

from chatpage.vocab import WEIGHT_FORMATS

STORY = "Write a long story about a lighthouse keeper."
STREAM_WINDOW_S = 4.0  # streaming with no input, before the keys


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
    from textual import events

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

        personas = app.personas
        for i in range(args.sessions - 1):
            await app.chat.open_session(personas[i % len(personas)])
        for session in list(app.chats.sessions):
            app.chat.current = session
            await app.chat.submit_prompt(f"/max {args.max_tokens}")
            await app.chat.submit_prompt(STORY)
        prompt = app.chat.prompt
        prompt.focus()
        await pilot.pause()
        client = app.client
        if not isinstance(client, LocalEngineClient) or client.engine is None:
            raise SystemExit("chatpage: error: bench ui measures the local engine")
        engine = client.engine
        # measure while every session decodes (persona pins and prompts prefilled first: on one
        # thread the nine personas' pins alone take seconds of prefill)
        while True:
            stats = client.stats()
            if stats is not None and engine.num_generated:
                if (
                    stats.num_running >= args.sessions
                    and not stats.num_waiting
                    and engine.num_generated >= 2 * args.sessions
                ):
                    break
                if not stats.num_running + stats.num_waiting:
                    raise SystemExit(
                        "chatpage: error: the replies ended before the measurement "
                        "began; raise --max-tokens"
                    )
            await asyncio.sleep(0.1)
        current = app.chat.current
        if current is None:
            raise SystemExit("chatpage: error: no chat is on show")
        reply = current.entries[-1]
        # the request's own sampling (the persona's): engine alone runs it the same way
        params = next(iter(list(engine.groups.values()))).params

        def shown() -> int:  # the current reply's tokens so far (one session: the only reply)
            return reply.stats.tokens if reply.stats is not None else 0

        generated0, t_start = engine.num_generated, time.perf_counter()
        stream_span = [shown(), 0]
        ui_cpu0 = time.thread_time()  # this thread is the app's: what it costs the engine
        await asyncio.sleep(STREAM_WINDOW_S)
        window = time.perf_counter() - t_start
        stream_tok_s = (engine.num_generated - generated0) / window
        stream_span[1] = shown()
        ui_cpu_share = (time.thread_time() - ui_cpu0) / window
        generated0, t_start = engine.num_generated, time.perf_counter()
        typing_span = [shown(), 0]
        latencies = []
        for i in range(args.keys):
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
                print(f"{i + 1}/{args.keys} keys", file=sys.stderr)
            stats = client.stats()
            if stats is not None and stats.num_running < args.sessions:  # a reply ended: stop
                break
            await asyncio.sleep(0.1)
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
                "goal_tui_vs_engine_alone": 0.9,
            }
            if alone
            else {}
        ),
    }


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


if __name__ == "__main__":
    sys.exit(main())
