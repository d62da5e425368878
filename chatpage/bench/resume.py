"""Resume after a restart: the disk tier of KV blocks (engine/core/kv_tiers.py) against recomputing.

Per model (the default model, and with ``--models`` a Qwen2.5-0.5B-shaped file, the default
model's weights tiled into its sizes: ``chatpage/bench/requant.py``), all in one run over one
load of its weights:
(a) A conversation of ~``--tokens`` tokens (a persona, then user and assistant turns of real
    text) is answered by an engine with a tier in a fresh folder, which writes its blocks as the
    turn ends; the engine is closed (a restart). The next turn's TTFT (its prompt: the
    conversation and a new question, one token decoded) on a new engine over that folder,
    against an engine without a tier, which recomputes it: ``resume_ratio`` = tier / recompute.
(b) The personas' pins at a fresh start: every shipped persona pinned by an engine over an
    empty folder (prefilled), then by one over the folder it wrote (read back): seconds until
    all are pinned and the steps taken (none, when every block comes from disk).
(c) The engine's throughput while the tier writes: a batch of requests (distinct prompts, a
    few decoded tokens each) on engines without a tier and with one in a fresh folder,
    alternated; ``tier_throughput_ratio`` = with / without (the best run of each); the tier
    writes each request's blocks as it ends. (The engine's own batch, not ``bench peers``,
    which needs vLLM beside it.)
(d) Reading ahead: the next turn of (a) sent to a restarted engine while another chat's reply
    is decoding (``BUSY`` tokens), with the tier's read-ahead on and off (``kv_disk_prefetch``):
    its TTFT, and the other chat's longest step meanwhile (off, the step that admits the turn
    reads its blocks; on, they are read while the other chat's steps run). Wall time (the
    point is what overlaps; process CPU time would add the reading thread's up).
(e) With ``--mcp``: the ``shell`` persona offering a real MCP filesystem server's tools (the npm
    package ``MCP_FILESYSTEM``, installed once under the cache's bench/ folder, started and
    listed by chatpage's own MCP client): the first reply of a new chat, its TTFT on an engine
    without a tier (the whole prompt computed) against one restarted over a tier that holds the
    persona's pin (pinned from disk, then the chat's own tokens computed), and that pin's time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_least, at_most, reader, table
from chatpage.bench.workloads import chat_sessions, persona_prompts, persona_text_tokens
from chatpage.engine import LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.core.kv_tiers import tier_usage
from chatpage.engine.load.loader import LoadedModel
from chatpage.engine.text.chat_template import render_prompt, system_prefix

DEFAULT_SCALE = 1.0
TOKENS = 4096
KV_DISK = 4 << 30
GOAL_RESUME_RATIO = {"default": 0.1, "qwen05": 0.05}  # TTFT with the tier over recompute
GOAL_TIER_THROUGHPUT = 0.97  # throughput with the tier writing over without
BATCH = 8
BATCH_PROMPT = 256
BATCH_NEW = 16
MCP_FILESYSTEM = "@modelcontextprotocol/server-filesystem"
MCP_QUESTION = "Which files in the project folder mention the tier, and what do they say?"
BUSY = 48  # tokens the other chat of (d) decodes; the next turn arrives after its first few


def conversation(tokenizer, target: int, seed: int) -> tuple[list[int], list[int]]:
    """A chat of about ``target`` tokens as the engine saw its last turn (the persona, then
    user questions and assistant replies of the personas' real text), and the next turn's
    prompt (the chat and one more question)."""
    session = chat_sessions(1, 400, num_personas=1, seed=seed)[0]
    text = persona_text_tokens(tokenizer)
    messages = [{"role": "system", "content": session.system_prompt}]
    at = 0
    history: list[int] = []
    for ask, reply_len in zip(session.user_turns, session.reply_tokens, strict=True):
        n = 2 * reply_len
        reply = tokenizer.decode(text[at : at + n])
        at = (at + n) % max(1, len(text) - 4 * n)
        messages += [{"role": "user", "content": ask}, {"role": "assistant", "content": reply}]
        history = render_prompt(tokenizer, messages, add_generation_prompt=False)
        if len(history) >= target:
            break
    question = {"role": "user", "content": session.user_turns[-1]}
    return history, render_prompt(tokenizer, [*messages, question])


def _first_token(eng: LLMEngine, prompt: list[int]) -> tuple[float, int]:
    """TTFT and prefix-hit tokens of ``prompt`` alone, one token decoded."""
    t0 = common.now()
    (out,) = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    return common.now() - t0, out.usage.cached_tokens


def _tiered(loaded: LoadedModel, folder: Path) -> LLMEngine:
    return common.engine(loaded, kv_disk_bytes=KV_DISK, kv_disk_dir=str(folder))


def resume(loaded: LoadedModel, target: int, seed: int, folder: Path) -> dict:
    tok = loaded.tokenizer
    history, next_turn = conversation(tok, target, seed)
    warm = next_turn[-8:]  # (each engine's first step pays its set-up: not the measured one)
    writer = _tiered(loaded, folder / "resume")
    _first_token(writer, warm)
    first_s, _ = _first_token(writer, history)
    writer.close()
    written = tier_usage(folder / "resume")
    resumed = _tiered(loaded, folder / "resume")
    _first_token(resumed, warm)
    resume_s, hits = _first_token(resumed, next_turn)
    from_disk = resumed.bm.tier_hit_tokens
    resumed.close()
    cold = common.engine(loaded)
    _first_token(cold, warm)
    recompute_s, _ = _first_token(cold, next_turn)
    return {
        "history_tokens": len(history),
        "next_turn_tokens": len(next_turn),
        "first_turn_s": first_s,
        "resume_ttft_s": resume_s,
        "recompute_ttft_s": recompute_s,
        "resume_ratio": resume_s / recompute_s,
        "resume_hit_tokens": hits,
        "resume_disk_tokens": from_disk,
        "tier_files": written.files,
        "tier_bytes": written.bytes,
    }


def _busy_turn(loaded: LoadedModel, folder: Path, ahead: bool, turn: list[int]) -> tuple:
    """(d) one way: ``turn``'s TTFT on an engine over ``folder`` that decodes another chat
    meanwhile, and the other chat's longest step from the turn's arrival to its first token."""
    eng = common.engine(
        loaded, kv_disk_bytes=KV_DISK, kv_disk_dir=str(folder), kv_disk_prefetch=ahead
    )
    _first_token(eng, turn[-8:])
    other = eng.add_request(
        turn[-200:][::-1], SamplingParams(temperature=0, max_tokens=BUSY, ignore_eos=True)
    )
    for _ in range(3):  # (its prefill and two decode steps)
        eng.step()
    outputs = OutputAccumulator()
    t0 = time.perf_counter()
    rid = eng.add_request(turn, SamplingParams(temperature=0, max_tokens=1))
    longest = 0.0
    ttft = None
    while ttft is None:
        s0 = time.perf_counter()
        updates = eng.step()
        longest = max(longest, time.perf_counter() - s0)
        for update in updates:
            if update.request_id == rid and outputs.add(update).outputs[0].token_ids:
                ttft = time.perf_counter() - t0
    hits = eng.tier.stats().prefetched if eng.tier is not None else 0
    if other in eng.groups:
        eng.abort(other)
    eng.close()
    return ttft, longest, hits


def read_ahead(loaded: LoadedModel, target: int, seed: int, folder: Path) -> dict:
    _, next_turn = conversation(loaded.tokenizer, target, seed)
    on_s, on_step, ahead_blocks = _busy_turn(loaded, folder / "resume", True, next_turn)
    off_s, off_step, _ = _busy_turn(loaded, folder / "resume", False, next_turn)
    return {
        "ahead_ttft_s": on_s,
        "no_ahead_ttft_s": off_s,
        "ahead_longest_step_s": on_step,
        "no_ahead_longest_step_s": off_step,
        "ahead_blocks": ahead_blocks,
    }


def mcp_tools(folder: Path) -> list[dict]:
    """The tools of a real MCP filesystem server over ``folder``, as OpenAI function tools
    (npm installs the server once under the cache's bench/ folder)."""
    import asyncio
    import subprocess

    from chatpage.chat.mcp import McpServers, ServerState
    from chatpage.config.mcp import McpServerConfig
    from chatpage.config.paths import cache_dir

    prefix = cache_dir() / "bench" / "mcp-filesystem"
    command = prefix / "node_modules" / ".bin" / "mcp-server-filesystem"
    if not command.exists():
        common.say(f"installing {MCP_FILESYSTEM} (npm) under {prefix}")
        subprocess.run(
            ["npm", "install", "--prefix", str(prefix), MCP_FILESYSTEM],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    async def listed() -> list[dict]:
        config = McpServerConfig("files", command=str(command), args=(str(folder),))
        servers = McpServers({"files": config})
        try:
            await servers.start(["files"])
            server = servers.servers["files"]
            if server.state != ServerState.RUNNING:
                raise RuntimeError(f"the MCP filesystem server did not start: {server.why}")
            return [tool.function() for tool in servers.tools(["files"])]
        finally:
            await servers.close()

    return asyncio.run(listed())


def mcp_persona(loaded: LoadedModel, folder: Path) -> dict:
    from chatpage.engine.client import chat_ids, persona_prefix

    tok = loaded.tokenizer
    system = dict(persona_prompts())["shell"]
    (folder / "project").mkdir(parents=True, exist_ok=True)
    tools = mcp_tools(folder / "project")
    prefix = persona_prefix(tok, system, tools)
    chat = [{"role": "system", "content": system}, {"role": "user", "content": MCP_QUESTION}]
    prompt = chat_ids(tok, chat, tools)
    if prompt[: len(prefix)] != prefix:
        raise RuntimeError("the persona's pin is not the prefix of its chats' prompts")
    cold = common.engine(loaded)
    _first_token(cold, prompt[-8:])
    cold_s, _ = _first_token(cold, prompt)
    first = _tiered(loaded, folder / "mcp")  # the first process: pins it, computed
    first.pin_prefix(prefix)
    common.drain(first)
    first.close()
    warm = _tiered(loaded, folder / "mcp")  # after a restart
    _first_token(warm, prompt[-8:])
    t0 = common.now()
    warm.pin_prefix(prefix)
    pin_steps = common.drain(warm)
    pin_s = common.now() - t0
    warm_s, hits = _first_token(warm, prompt)
    warm.close()
    return {
        "mcp_tools": len(tools),
        "mcp_prompt_tokens": len(prompt),
        "mcp_prefix_tokens": len(prefix),
        "mcp_cold_ttft_s": cold_s,
        "mcp_warm_pin_s": pin_s,
        "mcp_warm_pin_steps": pin_steps,
        "mcp_warm_ttft_s": warm_s,
        "mcp_warm_hit_tokens": hits,
    }


def _pin_all(eng: LLMEngine, prefixes: list[list[int]]) -> tuple[float, int]:
    """Seconds until every prefix is pinned, and the steps that took."""
    t0 = common.now()
    for p in prefixes:
        eng.pin_prefix(p)
    steps = common.drain(eng)
    return common.now() - t0, steps


def personas_ready(loaded: LoadedModel, folder: Path) -> dict:
    tok = loaded.tokenizer
    prefixes = [system_prefix(tok, system) for _name, system in persona_prompts()]
    cold = _tiered(loaded, folder / "personas")
    _first_token(cold, prefixes[0][-8:])
    cold_s, cold_steps = _pin_all(cold, prefixes)
    cold.close()
    warm = _tiered(loaded, folder / "personas")
    _first_token(warm, prefixes[0][-8:])
    warm_s, warm_steps = _pin_all(warm, prefixes)
    pinned = warm.stats().blocks_pinned
    warm.close()
    return {
        "personas": len(prefixes),
        "persona_tokens": sum(len(p) for p in prefixes),
        "pinned_blocks": pinned,
        "cold_pin_s": cold_s,
        "cold_pin_steps": cold_steps,
        "warm_pin_s": warm_s,
        "warm_pin_steps": warm_steps,
    }


def throughput(loaded: LoadedModel, folder: Path, seed: int, rounds: int) -> dict:
    tok = loaded.tokenizer
    text = persona_text_tokens(tok)
    step = max(1, (len(text) - BATCH_PROMPT) // BATCH)
    prompts = [text[i * step : i * step + BATCH_PROMPT] for i in range(BATCH)]
    params = SamplingParams(temperature=0, max_tokens=BATCH_NEW, ignore_eos=True, seed=seed)
    best = {"off": 0.0, "on": 0.0}
    for r in range(rounds):
        for mode in ("off", "on"):
            eng = _tiered(loaded, folder / f"batch-{r}") if mode == "on" else common.engine(loaded)
            _first_token(eng, prompts[0][-8:])
            t0 = common.now()
            outs = eng.generate(prompts, params)
            seconds = common.now() - t0
            eng.close()
            tokens = sum(
                len(p) + len(o.outputs[0].token_ids) for p, o in zip(prompts, outs, strict=True)
            )
            best[mode] = max(best[mode], tokens / seconds)
    return {
        "batch": BATCH,
        "batch_prompt_tokens": BATCH_PROMPT,
        "batch_new_tokens": BATCH_NEW,
        "no_tier_tokens_per_s": best["off"],
        "tier_tokens_per_s": best["on"],
        "tier_throughput_ratio": best["on"] / best["off"],
    }


def _model_path(which: str) -> str | None:
    if which == "default":
        return None
    from chatpage.bench.requant import shaped

    return str(shaped(which))


def main(argv: list[str] | None = None) -> int:
    p = common.parser("resume", "resuming a chat after a restart from the KV disk tier", 1.0)
    p.add_argument(
        "--models",
        default="default",
        help="comma-separated: default, qwen05 (the Qwen2.5-0.5B-shaped file); --model "
        "replaces the default one",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="alternated runs of (c), each way (default 2)"
    )
    p.add_argument(
        "--mcp",
        action="store_true",
        help=f"(e): a persona offering a real MCP filesystem server's tools (npm: {MCP_FILESYSTEM})",
    )
    args = common.parse(p, argv)
    target = max(64, round(TOKENS * args.scale))
    runs: list[dict] = []
    info: dict = {}
    folder = Path(tempfile.mkdtemp(prefix="chatpage-resume-"))
    try:
        for which in [m.strip() for m in args.models.split(",") if m.strip()]:
            if which not in GOAL_RESUME_RATIO:
                p.error(f"unknown model {which!r} in --models: use default or qwen05")
            path = args.model if which == "default" and args.model else _model_path(which)
            loaded = common.load(path)
            common.say(f"{which}: (a) a {target}-token chat, resumed after a restart")
            info = info or common.model_info(loaded)
            run = {"which": which, "model": loaded.name}
            run |= resume(loaded, target, args.seed, folder / which)
            common.say(
                f"{which}: TTFT resumed {run['resume_ttft_s']:.3f} s, "
                f"recomputed {run['recompute_ttft_s']:.3f} s"
            )
            common.say(f"{which}: (d) the next turn while another chat decodes, read ahead")
            run |= read_ahead(loaded, target, args.seed, folder / which)
            if not runs:  # (the first model's)
                common.say(f"{which}: (b) the personas pinned at a fresh start, then again")
                run |= personas_ready(loaded, folder / which)
                common.say(f"{which}: (c) throughput with the tier writing and without")
                run |= throughput(loaded, folder / which, args.seed, args.rounds)
                if args.mcp:
                    common.say(f"{which}: (e) a persona with an MCP filesystem server's tools")
                    run |= mcp_persona(loaded, folder / which)
            runs.append(run)
            del loaded
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result = {"benchmark": "resume", "scale": args.scale, "seed": args.seed, **info, "runs": runs}
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResumeRun:
    which: str
    model: str
    history_tokens: int
    next_turn_tokens: int
    resume_ttft_s: float
    recompute_ttft_s: float
    resume_ratio: float
    resume_hit_tokens: int
    resume_disk_tokens: int
    tier_bytes: int
    personas: int | None = None
    pinned_blocks: int | None = None
    cold_pin_s: float | None = None
    cold_pin_steps: int | None = None
    warm_pin_s: float | None = None
    warm_pin_steps: int | None = None
    tier_throughput_ratio: float | None = None
    ahead_ttft_s: float | None = None
    no_ahead_ttft_s: float | None = None
    ahead_longest_step_s: float | None = None
    no_ahead_longest_step_s: float | None = None
    ahead_blocks: int | None = None
    mcp_tools: int | None = None
    mcp_prompt_tokens: int | None = None
    mcp_cold_ttft_s: float | None = None
    mcp_warm_pin_s: float | None = None
    mcp_warm_pin_steps: int | None = None
    mcp_warm_ttft_s: float | None = None


@dataclass(frozen=True)
class ResumeResult:
    runs: list[ResumeRun]


def goals(r: ResumeResult) -> list[Goal]:
    out = [
        at_most(
            "resume",
            f"TTFT resumed / recomputed ({run.which})",
            run.resume_ratio,
            GOAL_RESUME_RATIO[run.which],
            f"{run.resume_disk_tokens} of {run.next_turn_tokens} prompt tokens read from disk; "
            "the rest is the new question and one step's fixed cost",
        )
        for run in r.runs
    ]
    for run in r.runs:
        if run.warm_pin_steps is not None:
            out.append(
                Goal(
                    "resume",
                    "a cached start pins every persona without a prefill step",
                    f"{run.warm_pin_steps} steps",
                    "0 steps",
                    run.warm_pin_steps == 0,
                    f"{run.personas} personas, {run.pinned_blocks} blocks read from disk",
                )
            )
        if run.tier_throughput_ratio is not None:
            out.append(
                at_least(
                    "resume",
                    "throughput with the tier writing / without",
                    run.tier_throughput_ratio,
                    GOAL_TIER_THROUGHPUT,
                    "the tier's thread reads released blocks in place and writes them",
                )
            )
    return out


def figures(r: ResumeResult) -> list[str]:
    rows = [
        [
            run.which,
            run.next_turn_tokens,
            run.resume_disk_tokens,
            f"{run.recompute_ttft_s:.3f}",
            f"{run.resume_ttft_s:.3f}",
            f"{run.resume_ratio:.4f}",
        ]
        for run in r.runs
    ]
    lines = [
        "(a) The next turn of a chat after a restart, TTFT with the KV disk tier against "
        "recomputing it:",
        "",
        table(["model", "prompt tokens", "from disk", "recompute s", "resumed s", "ratio"], rows),
    ]
    for run in r.runs:
        if run.warm_pin_steps is not None:
            lines += [
                "",
                f"(b) {run.which}: {run.personas} personas ({run.pinned_blocks} blocks) pinned at "
                f"a fresh start in {run.cold_pin_s:.2f} s and {run.cold_pin_steps} steps over an "
                f"empty tier, {run.warm_pin_s:.3f} s and {run.warm_pin_steps} steps over the "
                "tier they wrote.",
            ]
        if run.tier_throughput_ratio is not None:
            lines += [
                "",
                f"(c) {run.which}: a batch's throughput with the tier writing / without: "
                f"**{run.tier_throughput_ratio:.3f}**.",
            ]
    for run in r.runs:
        if run.ahead_ttft_s is not None and run.no_ahead_ttft_s is not None:
            lines += [
                "",
                f"(d) {run.which}: the next turn sent while another chat decodes: TTFT "
                f"{run.ahead_ttft_s:.3f} s with {run.ahead_blocks} blocks read ahead, "
                f"{run.no_ahead_ttft_s:.3f} s read in the step that admits it; the other "
                f"chat's longest step meanwhile {run.ahead_longest_step_s:.3f} s against "
                f"{run.no_ahead_longest_step_s:.3f} s.",
            ]
        if run.mcp_cold_ttft_s is not None:
            lines += [
                "",
                f"(e) {run.which}: a new chat of the shell persona offering an MCP filesystem "
                f"server's {run.mcp_tools} tools ({run.mcp_prompt_tokens} prompt tokens): first "
                f"token in {run.mcp_cold_ttft_s:.2f} s computed, {run.mcp_warm_ttft_s:.3f} s "
                f"after a restart over the tier (the pin read from disk in "
                f"{run.mcp_warm_pin_s:.3f} s, {run.mcp_warm_pin_steps} steps).",
            ]
    return lines


SECTION = Section(
    reader(ResumeResult), goals, figures, args=("--models", "default,qwen05", "--mcp")
)
