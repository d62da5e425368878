"""Prefix reuse: persona prompts computed once, and each conversation's own history turn by turn.

(a) Sessions that all start with one persona's ~300-token system prompt: time to first token with
    the persona prefilled and pinned (``engine.pin_prefix``) against cold (an engine without
    prefix caching). Sessions run one after another, so TTFT is the prefill itself, no queueing
    (timed by the benchmarks' clock, see common.now); ``ttft_ratio`` = median cached / median
    cold.
(b) One conversation of several turns on the caching engine, its replies SAMPLED (temperature
    0.8, top-p 0.95, seeded): per turn, the prompt's length, its new tokens (what the turn adds
    after the previous turn's prompt + reply), the tokens served from the cache and those
    actually computed (prompt - prefix_hit_tokens). ``turns``: each reply goes back into the
    next prompt as the token ids the model sampled (what the chat does); only full blocks are
    shared, so a turn computes at most its new tokens plus one block. ``turns_retokenized``: the
    same chat with each reply's text tokenized again (what a server given text does): a sampled
    reply the tokenizer would split otherwise is computed again from the first difference on.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from chatpage.bench import common, plots
from chatpage.bench.reporting import Goal, Section, at_most, reader, table
from chatpage.bench.workloads import chat_sessions
from chatpage.chat.conversation import Conversation
from chatpage.engine import EngineConfig, SamplingParams
from chatpage.engine.text.chat_template import render_prompt, system_prefix

DEFAULT_SCALE = 1.0
SESSIONS = 16
TURNS = 8
GOAL_TTFT_RATIO = 0.25  # TTFT with the persona's prefix cached over cold


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _first_token(eng, prompt: list[int]) -> tuple[float, int]:
    """TTFT and prefix-hit tokens of one request alone, decoding a single token."""
    t0 = common.now()
    (out,) = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    return common.now() - t0, out.usage.cached_tokens


def ttft_sessions(loaded, sessions) -> dict:
    tok = loaded.tokenizer
    system = sessions[0].system_prompt
    prompts = [
        render_prompt(
            tok,
            [{"role": "system", "content": system}, {"role": "user", "content": s.user_turns[0]}],
        )
        for s in sessions
    ]
    warm = prompts[0][-8:]
    cold = common.engine(loaded, enable_prefix_caching=False)
    _first_token(cold, warm)
    cold_ttft = [_first_token(cold, p)[0] for p in prompts]
    del cold
    cached = common.engine(loaded)
    _first_token(cached, warm)
    rid = cached.pin_prefix(system_prefix(tok, system))
    common.drain(cached)
    hits = []
    cached_ttft = []
    for p in prompts:
        t, h = _first_token(cached, p)
        cached_ttft.append(t)
        hits.append(h)
    cached.unpin_prefix(rid)
    return {
        "sessions": len(sessions),
        "persona": sessions[0].persona,
        "persona_prefix_tokens": len(system_prefix(tok, system)),
        "mean_prompt_tokens": statistics.fmean(len(p) for p in prompts),
        "cold_ttft_s": statistics.median(cold_ttft),
        "cached_ttft_s": statistics.median(cached_ttft),
        "cached_prefix_hit_tokens": statistics.median(hits),
        "ttft_ratio": statistics.median(cached_ttft) / statistics.median(cold_ttft),
    }


def conversation(loaded, session, own_ids: bool) -> list[dict]:
    """The turns of ``session`` with sampled replies; ``own_ids``: each reply goes back as its
    sampled token ids, else as its text tokenized again."""
    eng = common.engine(loaded)
    tok = loaded.tokenizer
    prefix = system_prefix(tok, session.system_prompt)
    eng.pin_prefix(prefix)
    common.drain(eng)
    conv = Conversation(session.system_prompt)
    reply_ids: dict[int, list[int]] = {}
    previous = prefix  # what the cache holds for the next prompt
    turns = []
    for i, (ask, reply_len) in enumerate(
        zip(session.user_turns, session.reply_tokens, strict=True)
    ):
        conv.add("user", ask)
        prompt = render_prompt(tok, conv.for_model(), reply_ids=reply_ids if own_ids else None)
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=1000 + i, max_tokens=reply_len)
        t0 = common.now()
        (out,) = eng.generate([prompt], params)
        seconds = common.now() - t0
        new = max(len(prompt) - len(previous), 0)
        computed = len(prompt) - out.usage.cached_tokens
        turns.append(
            {
                "turn": i + 1,
                "prompt_tokens": len(prompt),
                "new_tokens": new,
                "computed_tokens": computed,
                "prefix_hit_tokens": out.usage.cached_tokens,
                "reused_share": out.usage.cached_tokens / len(prompt),
                "shared_with_previous": _common_prefix(prompt, previous),
                "reply_tokens": len(out.outputs[0].token_ids),
                "turn_s": seconds,
                "within_new_plus_block": computed <= new + eng.config.block_size,
            }
        )
        conv.add("assistant", out.outputs[0].text)
        reply_ids[len(conv.messages)] = out.outputs[0].token_ids  # its index after the system
        previous = prompt + out.outputs[0].token_ids
    return turns


def main(argv: list[str] | None = None) -> int:
    p = common.parser("prefix", "persona prefix caching and multi-turn reuse", DEFAULT_SCALE)
    p.add_argument(
        "--sessions",
        type=int,
        default=None,
        help=f"sessions for the TTFT comparison (default {SESSIONS} x scale)",
    )
    p.add_argument(
        "--turns",
        type=int,
        default=None,
        help=f"turns of the conversation (default {TURNS} x scale)",
    )
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    args = common.parse(p, argv)
    n = args.sessions or max(2, round(SESSIONS * args.scale))
    turns = args.turns or max(2, round(TURNS * args.scale))
    mean_reply = max(4, round(48 * min(args.scale, 1.0)))

    loaded = common.load(args.model)
    sessions = chat_sessions(n, turns, num_personas=1, mean_reply=mean_reply, seed=args.seed)
    common.say(f"(a) {n} sessions, persona {sessions[0].persona}: cold vs pinned prefix")
    ttft = ttft_sessions(loaded, sessions)
    common.say(f"(a) TTFT cold {ttft['cold_ttft_s']:.3f} s, cached {ttft['cached_ttft_s']:.3f} s")
    common.say(f"(b) one conversation of {turns} turns")
    rows = conversation(loaded, sessions[0], own_ids=True)
    common.say("(b) the same chat, its replies tokenized again")
    retokenized = conversation(loaded, sessions[0], own_ids=False)
    result = {
        "benchmark": "prefix",
        "scale": args.scale,
        "seed": args.seed,
        **common.model_info(loaded),
        **ttft,
        "goal_ttft_ratio": GOAL_TTFT_RATIO,
        "turns": rows,
        "block_size": EngineConfig().block_size,
        "all_turns_within_new_plus_block": all(r["within_new_plus_block"] for r in rows),
        "turns_retokenized": retokenized,
        "retokenized_turns_within_new_plus_block": sum(
            r["within_new_plus_block"] for r in retokenized
        ),
    }
    if args.plot:
        result["plot"] = plots.prefix(result, args.plot)
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Turn:
    turn: int
    prompt_tokens: int
    new_tokens: int
    computed_tokens: int
    prefix_hit_tokens: int


@dataclass(frozen=True)
class PrefixResult:
    """What the report reads of a run's JSON."""

    sessions: int
    persona: str
    persona_prefix_tokens: int
    mean_prompt_tokens: float
    cached_prefix_hit_tokens: float
    cold_ttft_s: float
    cached_ttft_s: float
    ttft_ratio: float
    turns: list[Turn]
    block_size: int
    all_turns_within_new_plus_block: bool


def goals(p: PrefixResult) -> list[Goal]:
    worst = max(r.computed_tokens - r.new_tokens for r in p.turns)
    return [
        at_most(
            "prefix",
            "TTFT cached / cold",
            p.ttft_ratio,
            GOAL_TTFT_RATIO,
            f"the pinned persona leaves {p.mean_prompt_tokens - p.cached_prefix_hit_tokens:.0f}"
            f" of {p.mean_prompt_tokens:.0f} prompt tokens to compute; the rest of TTFT is one "
            "step's fixed cost (30 layers of weights read, the lm_head, sampling)",
        ),
        Goal(
            "prefix",
            "each turn computes <= new tokens + one block",
            f"worst excess {worst}",
            f"<= {p.block_size}",
            p.all_turns_within_new_plus_block,
            "only full blocks are shared by hash: a turn recomputes at most the partial block "
            "where the previous prompt + reply ended",
        ),
    ]


def figures(r: PrefixResult) -> list[str]:
    rows = [
        [t.turn, t.prompt_tokens, t.new_tokens, t.computed_tokens, t.prefix_hit_tokens]
        for t in r.turns
    ]
    return [
        f"(a) {r.sessions} sessions with the {r.persona} persona "
        f"({r.persona_prefix_tokens}-token prefix): TTFT cold "
        f"{r.cold_ttft_s * 1e3:.0f} ms, cached {r.cached_ttft_s * 1e3:.0f} ms, ratio "
        f"**{r.ttft_ratio:.3f}**.",
        "",
        "(b) One conversation:",
        "",
        table(["turn", "prompt tokens", "new tokens", "computed", "prefix hit"], rows),
    ]


SECTION = Section(reader(PrefixResult), goals, figures, plotted=True)
