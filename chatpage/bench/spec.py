"""Draftless speculative decoding (issue 43, ``engine/core/speculate.py``): speculation on
against off on the default model, side by side in one run, on tasks a user would give.

(a) ``edit``: "return this file with one change" on a ~200-line source file of chatpage's own
(the reply's first words given: the default model starts to explain the file otherwise);
(b) ``summary``: a summary that quotes its source; (c) ``regenerate``: the same question asked
again, the first reply (on the engine without speculation, as the chat had it) sent as the
draft source (what the chat's regenerate sends), and
``edit_resend``: the question reworded, the earlier reply as the draft source; (d) ``open``: a
story, nothing to copy. Each runs greedy at ``--concurrency`` requests at once (1, 8, 32 by
default: the requests of a batch are the task's prompt with a different number in front), on
two engines over the same weights, speculation off (``num_speculative_tokens=0``) and on; the
prompts are prefilled first (``max_tokens=1``) so the timed run is the decode, the best of
``--repeats`` alternating runs of each. Per task and
concurrency: decode tokens per second both ways and their ratio, drafted and accepted tokens,
and whether every output is the same token for token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_least, reader, table
from chatpage.engine import SamplingParams
from chatpage.engine.text.chat_template import continue_prompt, render_prompt

DEFAULT_SCALE = 1.0
CONCURRENCY = (1, 8, 32)
MAX_TOKENS = 192
GOALS = {"edit": 2.0, "regenerate": 2.0, "edit_resend": 2.0, "summary": 1.4, "open": 0.97}
GOAL_BATCHED = 0.97  # spec on / off at every concurrency, every task
KV_CACHE_BYTES = 3 << 29  # 35k tokens of the default model (fp32 KV)
SOURCE = Path(__file__).resolve().parents[1] / "engine" / "core" / "scheduler.py"
ARTICLE = (
    "The paged KV cache keeps every sequence's keys and values in blocks of sixteen tokens. "
    "A block that holds a persona's system prompt is computed once and pinned, so every chat "
    "that starts with that persona reads it instead of computing it again. When the pool runs "
    "out of blocks, the most recently arrived request is preempted: its blocks are either "
    "dropped and recomputed later, or copied to a swap pool in CPU memory and copied back. "
    "Blocks that several sequences share, such as the prompt of a request with several "
    "samples, are copied only when one of them writes into a shared block. A block that is "
    "full is indexed by a hash of its tokens and of every token before it, so a later prompt "
    "that starts with the same tokens finds it."
)


def _chat(tok, user: str, task: str = "") -> list[int]:
    """The prompt of ``user``'s message; the edit's reply already started, as a user who asks
    for a file back gets it (the default model, 135M parameters, explains the file instead
    when left to start its answer)."""
    messages = [{"role": "user", "content": user}]
    if task != "edit":
        return render_prompt(tok, messages)
    opening = "Here is the file with the class renamed:\n\n```python\n"
    return continue_prompt(tok, [*messages, {"role": "assistant", "content": opening}])


def tasks(tok, lines: int) -> dict[str, str]:
    """Each task's user message (the regenerate and edit tasks' are the open question's)."""
    source = "".join(SOURCE.read_text().splitlines(keepends=True)[:lines])
    return {
        "edit": "Return this file with one change: rename the class Scheduler to "
        f"BatchScheduler. Output the whole file.\n\n```python\n{source}```",
        "summary": "Summarize this text in a few sentences, quoting its key sentences word "
        f"for word.\n\n{ARTICLE}",
        "regenerate": "Explain what a paged KV cache is and why it helps serving many chats.",
        "edit_resend": "Explain what a paged KV cache is and why it helps serving many users.",
        "open": "Write a short story about a cat who learns to play the piano.",
    }


def run(engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    """Decode time and outputs of ``prompts`` at once, their prompts prefilled first."""
    engine.generate(prompts, SamplingParams(temperature=0, max_tokens=1))
    t0 = common.now()
    outs = engine.generate(prompts, params)
    return common.now() - t0, [o.outputs[0].token_ids for o in outs]


def main(argv: list[str] | None = None) -> int:
    p = common.parser("spec", "speculative decoding on against off", DEFAULT_SCALE)
    p.add_argument(
        "--concurrency",
        default=",".join(map(str, CONCURRENCY)),
        help="requests at once, comma-separated (default %(default)s)",
    )
    p.add_argument("--weights", default="int4", help="the weight format (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each (default %(default)s)")
    args = common.parse(p, argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    max_tokens = max(16, round(MAX_TOKENS * args.scale))
    loaded = common.load(args.model)
    tok = loaded.tokenizer
    # a pool that holds 32 edits at once: no preemption (a recomputed prompt is computed in
    # larger steps than it decoded in, so its numbers, and the replies, may change)
    pool = {
        "weight_dtype": args.weights,
        "kv_cache_bytes": KV_CACHE_BYTES,
        "swap_space_bytes": 64 << 20,
    }
    off = common.engine(loaded, num_speculative_tokens=0, **pool)
    on = common.engine(loaded, **pool)
    users = tasks(tok, max(20, round(200 * args.scale)))
    plain = SamplingParams(temperature=0, max_tokens=max_tokens)
    earlier: list[list[int]] = []
    rows = []
    for task, user in users.items():
        if task == "regenerate":
            # the reply the regenerate and the edit replace: the open question's first answer,
            # on the engine without speculation as a chat has it, after the tasks before (the
            # two compared have seen the same prompts, so their prefix caches hold the same
            # bits, those of the blocks this prompt shares with earlier ones included)
            (first,) = off.generate([_chat(tok, users["regenerate"])], plain)
            earlier.append(first.outputs[0].token_ids)
        sources = earlier if task in ("regenerate", "edit_resend") else []
        for n in levels:
            prompts = [_chat(tok, f"({i + 1}) {user}" if n > 1 else user, task) for i in range(n)]
            params = SamplingParams(temperature=0, max_tokens=max_tokens, draft_source=sources)
            t_off = t_on = float("inf")
            for _ in range(args.repeats):  # alternating, the best of each
                t, got_off = run(off, prompts, params)
                t_off = min(t_off, t)
                base = on.speculator.drafted, on.speculator.accepted
                t, got_on = run(on, prompts, params)
                t_on = min(t_on, t)
            tokens = sum(map(len, got_on))
            row = {
                "task": task,
                "concurrency": n,
                "tokens": tokens,
                "off_tok_s": sum(map(len, got_off)) / t_off,
                "on_tok_s": tokens / t_on,
                "ratio": t_off / t_on * tokens / max(1, sum(map(len, got_off))),
                "drafted": on.speculator.drafted - base[0],
                "accepted": on.speculator.accepted - base[1],
                "identical": sum(a == b for a, b in zip(got_off, got_on, strict=True)) / n,
            }
            common.say(
                f"{task} x{n}: off {row['off_tok_s']:.1f} tok/s, on {row['on_tok_s']:.1f} "
                f"({row['ratio']:.2f}x), accepted {row['accepted']}/{row['drafted']}, "
                f"identical {row['identical']:.0%}"
            )
            rows.append(row)
    result = {
        "benchmark": "spec",
        "scale": args.scale,
        "weights": args.weights,
        "max_tokens": max_tokens,
        "exact_rows": on.model.exact_rows,
        **common.model_info(loaded),
        "rows": rows,
    }
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SpecRow:
    task: str
    concurrency: int
    tokens: int
    off_tok_s: float
    on_tok_s: float
    ratio: float
    drafted: int
    accepted: int
    identical: float


@dataclass(frozen=True)
class SpecResult:
    """What the report reads of a run's JSON."""

    weights: str
    max_tokens: int
    rows: list[SpecRow]


def goals(r: SpecResult) -> list[Goal]:
    out = []
    for row in r.rows:
        want = GOALS[row.task] if row.concurrency == 1 else GOAL_BATCHED
        out.append(
            at_least(
                "spec",
                f"decode tok/s, speculation on / off, {row.task} x{row.concurrency}",
                row.ratio,
                want,
                f"{row.accepted} of {row.drafted} drafted tokens accepted",
            )
        )
    out.append(
        at_least(
            "spec",
            "greedy outputs identical with and without speculation",
            min(row.identical for row in r.rows),
            1.0,
            "row-invariant kernels within LlamaModel.exact_rows",
        )
    )
    return out


def figures(r: SpecResult) -> list[str]:
    return [
        f"Greedy, {r.max_tokens} new tokens a request, {r.weights} weights, prompts prefilled "
        "first; speculation off and on over the same weights in one run.",
        "",
        table(
            ["task", "requests", "off tok/s", "on tok/s", "ratio", "accepted / drafted", "same"],
            [
                [
                    row.task,
                    row.concurrency,
                    row.off_tok_s,
                    row.on_tok_s,
                    row.ratio,
                    f"{row.accepted}/{row.drafted}",
                    f"{row.identical:.0%}",
                ]
                for row in r.rows
            ],
        ),
    ]


SECTION = Section(reader(SpecResult), goals, figures)
