"""Helpers shared by test modules (instead of test modules importing each other).

UI: building the app over the tiny model or over no model, waiting in Pilot, personas on disk.
Chat model: a persona, a client that records what it is asked (the chat model's tests need
no engine), and engine updates to feed back. MCP: a stdio server that never answers
``initialize``, and whether a process still runs.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from textual.command import CommandList, CommandPalette
from textual.pilot import Pilot

from chatpage.chat.chats import Chats
from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.config.mcp import McpServerConfig
from chatpage.config.personas import Persona
from chatpage.config.settings import Settings
from chatpage.engine.client import (
    ChatRequest,
    EngineConfig,
    FinishReason,
    OutputDelta,
    RequestUpdate,
    Usage,
)
from chatpage.engine.outputs import EngineStats, final_update
from chatpage.ui.app import ChatApp
from chatpage.ui.widgets.alternatives import AlternativesView

PROMPT_BODY = (
    "Answer in plain words. Keep every answer short and to the point. Never invent "
    "facts. When unsure, say so. Use lists for steps and code blocks for code. "
)


# -- personas ----------------------------------------------------------------------------------------
def write_persona(directory: Path, name: str, max_tokens: int = 6, more: str = "") -> None:
    """Persona ``name`` in ``directory``; ``more``: further lines of YAML (``tools: [x]\n``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(
        f"name: {name}\ndescription: The {name} test persona\ngreeting: Hi from {name}\n"
        f"temperature: 0\nmax_tokens: {max_tokens}\n{more}"
        f"system_prompt: You are {name}. {PROMPT_BODY * 2}\n"
    )


def alpha_and_beta(tmp_path: Path) -> Path:
    """A personas folder with the "alpha" and "beta" test personas."""
    directory = tmp_path / "personas"
    write_persona(directory, "alpha")
    write_persona(directory, "beta")
    return directory


# -- apps ----------------------------------------------------------------------------------------------
def make_app(model_dir: Path, personas_dir: Path | None, **settings) -> ChatApp:
    """The app over ``model_dir`` (the tiny model) with a small KV cache."""
    return ChatApp(
        model=str(model_dir),
        config=EngineConfig(kv_cache_bytes=4 << 20),
        settings=Settings(default_persona="alpha", **settings),
        personas_dirs=None if personas_dir is None else [personas_dir],
    )


def offline_app(tmp_path: Path, **settings) -> ChatApp:
    """The app over a model path that does not exist (the engine fails at once)."""
    return ChatApp(
        model=str(tmp_path / "no-such-model"), config=EngineConfig(), settings=Settings(**settings)
    )


def fake_submits(app: ChatApp) -> list[list[dict[str, str]]]:
    """After the load failure: pretend the model loaded, and record what would be submitted
    (the request ids are ``fake-1``, ``fake-2``...; feed replies with `reply_update`)."""
    submitted: list[list[dict[str, str]]] = []
    app.client.error = None
    app.client.submit = lambda request, on_update: (
        submitted.append(request.messages) or f"fake-{len(submitted)}"
    )
    return submitted


def reply_update(rid: str, text: str, finished: bool) -> RequestUpdate:
    """An update of a plain reply that adds ``text`` (7 tokens; ends it when ``finished``)."""
    return RequestUpdate(
        rid,
        (
            OutputDelta(
                0,
                text,
                finish_reason=FinishReason.STOP if finished else None,
                cumulative_logprob=-3.5,
                num_tokens=7,
            ),
        ),
        Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=7),
        finished=finished,
        ttft_s=0.05,
        elapsed_s=0.4,
    )


def samples_update(rid: str, texts: list[str]) -> RequestUpdate:
    """The last update of a samples request: one finished output per text."""
    return RequestUpdate(
        rid,
        tuple(
            OutputDelta(
                i, text, finish_reason=FinishReason.STOP, cumulative_logprob=-2.0, num_tokens=3
            )
            for i, text in enumerate(texts)
        ),
        Usage(prompt_tokens=20, cached_tokens=0, completion_tokens=3 * len(texts)),
        finished=True,
        ttft_s=0.05,
        elapsed_s=0.3,
    )


def engine_stats() -> EngineStats:
    """A busy pool's stats, every segment of the gauge in use (what the engine would report)."""
    return EngineStats(
        num_blocks=64,
        block_size=16,
        bytes_per_block=4096,
        blocks_used=10,
        blocks_shared=2,
        blocks_private=5,
        blocks_cached=4,
        blocks_pinned=3,
        blocks_free=50,
        num_cpu_blocks=8,
        blocks_swapped=1,
        num_running=2,
        num_waiting=1,
        num_swapped=0,
        prefix_hit_tokens=32,
        preemptions_recompute=0,
        preemptions_swap=0,
        evictions=0,
        logical_blocks=12,
        tokens_per_s=12.5,
    )


# -- waiting ---------------------------------------------------------------------------------------------
async def wait_for(pilot, condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.05)


@asynccontextmanager
async def offline_run(
    tmp_path: Path, size: tuple[int, int], **settings
) -> AsyncIterator[tuple[ChatApp, Pilot]]:
    """(app, pilot): `offline_app` running at ``size``, once its load has failed (the opening of
    the tests that need no model: what they do then meets an app at rest)."""
    app = offline_app(tmp_path, **settings)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.client.error is not None, "the load failure")
        yield app, pilot


async def samples_on_show(pilot, app: ChatApp, question: str, texts: list[str]) -> None:
    """Ask ``question`` for one sample per text (the submit faked), feed the samples back, and
    wait until their panes have the focus."""
    fake_submits(app)
    session = app.chat.current
    await app.chat.submit_prompt(f"/samples {len(texts)}")
    await app.chat.submit_prompt(question)
    app.chats.requests.deliver(samples_update("fake-1", texts))
    await wait_for(
        pilot,
        lambda: isinstance(app.focused, AlternativesView) and not session.streaming,
        "the panes",
    )


@asynccontextmanager
async def tiny_run(
    model_dir: Path, personas_dir: Path | None, size: tuple[int, int], **settings
) -> AsyncIterator[tuple[ChatApp, Pilot]]:
    """(app, pilot): `make_app` running at ``size``, once its engine is ready and the personas'
    prompts are pinned (the opening of the tests over the tiny model)."""
    app = make_app(model_dir, personas_dir, **settings)
    async with app.run_test(size=size) as pilot:
        await ready(pilot, app)
        yield app, pilot


async def opened(pilot, screen_type) -> None:
    """Wait until a dialog of ``screen_type`` is on top, mounted, its widget focused if it has
    one (so the keys pressed next reach it: dialogs open in workers), and drawn."""

    def ready() -> bool:
        screen = pilot.app.screen
        return (
            isinstance(screen, screen_type)
            and screen.is_mounted
            and (screen.focused is not None or not screen.focus_chain)
        )

    await wait_for(pilot, ready, f"the {screen_type.__name__} dialog")
    await pilot.pause()


async def palette_offers(pilot, query: str) -> None:
    """Open the command palette, type ``query`` and wait until its search is done and a
    command is highlighted (enter then runs the best match)."""
    app = pilot.app
    app.action_command_palette()
    await opened(pilot, CommandPalette)
    palette = app.screen
    await pilot.press(*query)
    await wait_for(
        pilot,
        lambda: (
            palette.query_one(CommandList).highlighted is not None
            and not any(w.node is palette and w.is_running for w in app.workers)
        ),
        f"a command matching {query!r}",
    )


def idle(app: ChatApp) -> bool:
    stats = app.client.stats()
    return (
        stats is not None
        and stats.num_running == 0
        and stats.num_waiting == 0
        and not any(s.streaming for s in app.chats.sessions)
    )


async def ready(pilot, app: ChatApp) -> None:
    await wait_for(
        pilot,
        lambda: app.client.ready and idle(app) and app.client.stats().blocks_pinned > 0,
        "the engine and pinned personas",
    )


async def send(pilot, text: str) -> None:
    """What enter does with ``text`` in the prompt (typing is tested where the engine is idle:
    Pilot's key presses wait for the process to go idle, up to 2 s a key while it streams)."""
    await pilot.app.chat.submit_prompt(text)


def freed(app: ChatApp) -> bool:
    """Nothing runs and only the personas' pinned blocks are held."""
    stats = app.client.stats()
    return stats.num_running == 0 and stats.blocks_used == stats.blocks_pinned


def hold_model_load(monkeypatch) -> threading.Event:
    """Make the engine thread wait before loading the model until the event is set."""
    from chatpage.engine.llm_engine import LLMEngine  # what the engine thread loads with

    release = threading.Event()
    load = LLMEngine.from_pretrained

    def held(*args, **kwargs):
        release.wait(30)
        return load(*args, **kwargs)

    monkeypatch.setattr(LLMEngine, "from_pretrained", held)
    return release


# -- the chat model without an engine ---------------------------------------------------------
PERSONA = Persona("p", "a persona", "You are p.", temperature=0.5, max_tokens=8)


class FakeClient:
    """Stands in for an `EngineClient` in chat-model tests: records submits and cancels; the
    test feeds updates back with `Chats.apply`. Request ids are r1, r2, ..."""

    error = None
    ready = True
    counter = None
    thinking_switch = None
    model_name = "fake"

    def __init__(self, max_model_len: int = 0) -> None:
        self.max_model_len = max_model_len
        self.submitted: list[tuple[list, object, object]] = []
        self.requests: list[ChatRequest] = []
        self.continued: list[bool] = []
        self.cancelled: list[str] = []
        self.pinned: list[tuple[str, list | None]] = []

    def pin_system_prompt(self, system_prompt: str, tools=None) -> None:
        self.pinned.append((system_prompt, tools))

    def submit(self, request: ChatRequest, on_update) -> str:
        self.submitted.append((request.messages, request.params, on_update))
        self.requests.append(request)
        self.continued.append(request.continue_reply)
        return f"r{len(self.submitted)}"

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


def event(
    rid: str,
    text: str,
    index: int = 0,
    finished: bool = False,
    reason: FinishReason | None = None,
    **kw,
) -> RequestUpdate:
    """An update of request `rid` whose output `index` gains `text` (a token per character),
    ending that output with `reason`; `finished`: the request's last update."""
    return RequestUpdate(
        rid,
        (
            OutputDelta(
                index,
                text,
                finish_reason=reason,
                cumulative_logprob=kw.get("logprob", -1.0),
                score=kw.get("score"),
                num_tokens=len(text),
            ),
        ),
        Usage(kw.get("prompt_tokens", 20), 16, len(text)),
        finished=finished,
        error=kw.get("error"),
        ttft_s=0.1,
        elapsed_s=0.5,
    )


def done(rid: str, text: str, **kw) -> RequestUpdate:
    """The last update of a plain reply that finished normally, adding `text`."""
    return event(rid, text, finished=True, reason=FinishReason.STOP, **kw)


def stopped(rid: str) -> RequestUpdate:
    """The client's last update of request `rid` when it was cancelled."""
    return final_update(rid, FinishReason.ABORT, elapsed_s=1.0)


def settle(chats: Chats, events: queue.Queue, session: ChatSession) -> None:
    """Apply a real engine's events (as the app does on its thread) until the session is idle."""
    deadline = time.monotonic() + 60
    while session.streaming:
        assert time.monotonic() < deadline, "the reply did not finish"
        try:
            chats.requests.apply(events.get(timeout=1))
        except queue.Empty:
            continue


def facts(entries: list[Entry]) -> list[tuple]:
    """What each message holds (entries compare by identity: a restored one is another object)."""
    return [
        (e.role, e.content, e.status, e.attachments, e.stats, e.label, e.error) for e in entries
    ]


# -- models ------------------------------------------------------------------------------------------


def hf_model_dir(gguf: Path, root: Path) -> Path:
    """An HF directory (config.json, fp32 model.safetensors, the tokenizer files) of the GGUF
    file ``gguf`` as ``load_model`` reads it in fp32, under ``root`` (written once: the reference
    the tests run transformers on)."""
    import json
    import os
    import shutil
    import tempfile

    from safetensors.torch import save_file

    from chatpage.engine.load.gguf_file import GGUFFile
    from chatpage.engine.load.loader import gguf_cache_dir, gguf_tokenizer_dir, load_model

    out = root / f"{gguf_cache_dir(gguf).name}-hf"
    if (out / "model.safetensors").is_file():
        return out
    loaded = load_model(gguf, progress=lambda _m: None)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=root))
    c = loaded.config
    config = {
        "architectures": ["LlamaForCausalLM" if c.model_type == "llama" else "Qwen2ForCausalLM"],
        **{k: getattr(c, k) for k in c.__dataclass_fields__ if k != "sliding_window"},
        "bos_token_id": loaded.tokenizer.bos_token_id,
        "pad_token_id": loaded.tokenizer.pad_token_id,
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    state = {
        k: v for k, v in loaded.state.items() if k != "lm_head.weight" or not c.tie_word_embeddings
    }
    save_file(state, tmp / "model.safetensors")
    for f in gguf_tokenizer_dir(GGUFFile(gguf)).iterdir():
        if f.is_file():
            shutil.copy(f, tmp / f.name)
    try:
        os.replace(tmp, out)
    except OSError:  # another session wrote it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# -- MCP servers ---------------------------------------------------------------------------------
MUTE = """
import os, signal, sys
from contextlib import asynccontextmanager
import anyio
from mcp.server.mcpserver import MCPServer

@asynccontextmanager
async def never(_app):
    await anyio.sleep_forever()  # (before it reads a message: initialize is never answered)
    yield

app = MCPServer("mute", lifespan=never)

@app.tool()
def shout(text: str) -> str:
    \"\"\"Say it louder.\"\"\"
    return text.upper()

signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1], "w").write(str(os.getpid()))
app.run()
"""


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(") ", 1)[1][0] != "Z"


def mute_server(tmp_path: Path) -> tuple[McpServerConfig, Path]:
    """The config of `MUTE` (named "mute"), and the file its pid is written to."""
    script, pid_file = tmp_path / "mute_server.py", tmp_path / "mute.pid"
    script.write_text(MUTE)
    return McpServerConfig("mute", sys.executable, (str(script), str(pid_file))), pid_file
