"""Soak: thousands of mixed requests through a small block pool, checked after every step.

Greedy, sampled, n up to 4, beam up to 4, stop strings, random aborts, pinned persona prefixes
(some prompts start with them) and unpins (some before the pin is done), and one request in
twenty with sampling values at the edge of the float range (`EXTREMES`), run on a tiny random
Llama through a pool of 12-24 blocks, in every preemption mode. After every step the block
manager's reference counts must equal its tables' references plus its pins, and every group must
sit in the queue its status names. At the end every request must have ended within a bounded
number of steps, no block may be left (used == pinned, swap pool empty, then nothing once
unpinned), and greedy requests must produce the tokens they produce when run alone.

``chatpage bench soak --requests N`` runs N requests (split over the modes) and prints
{requests, finished, errored, failed_by_others, hung, leaked_blocks, steps, seconds}
(``--json``: as JSON); ``failed_by_others`` counts the requests of ordinary values that
failed: a request's values must never fail another's. Then one in `SERVE_SHARE` more goes
through a real `chatpage serve` with hostile requests mixed in (`chatpage.bench.soak_serve`):
its summary is ``serve``, and its ordinary requests that failed count in ``failed_by_others``.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from chatpage.bench import common, soak_serve
from chatpage.bench.reporting import Goal, Section, reader, table
from chatpage.engine import LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.core.sequence import GroupStatus
from chatpage.engine.load.loader import LoadedModel

MODES = ("recompute", "swap", "auto")
POOLS = {"recompute": 12, "swap": 16, "auto": 24}  # blocks of 16 tokens
SWAP_BLOCKS = 20
IN_FLIGHT = 10
GREEDY_CHECKS = 12  # greedy requests per mode rerun alone
EXTREME_SHARE = 0.05
EXTREMES: tuple[dict[str, Any], ...] = (
    {"temperature": 1e-40},  # logits / T overflow: greedy
    {"temperature": 1e-300, "top_k": 20},
    {"temperature": 1e300},  # (every token alike)
    {"top_p": 1e-300},  # 0 in float32: the nucleus is the top token
    {"top_p": 5e-324, "temperature": 1e-6, "top_k": 5},
)
BEAM_EXTREMES = (1e300, -1e300, 1000.0, -1000.0)  # length penalties: 3 ** 1000.0 overflows
SERVE_SHARE = 20


def tiny_model(tokenizer, seed: int = 0) -> LoadedModel:
    """A random one-layer Llama over the first 512 ids of ``tokenizer`` (fast to step)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.5)  # spread logits: few near-ties, varied outputs
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return LoadedModel("soak-tiny", None, config, state, tokenizer)


def make_engine(loaded: LoadedModel, mode: str) -> LLMEngine:
    """A small device pool and a swap pool that can fill up (then swapping falls back)."""
    return common.engine(
        loaded,
        blocks=POOLS[mode],
        preemption_mode=mode,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        swap_space_bytes=SWAP_BLOCKS * common.block_bytes(loaded),
    )


def audit(engine: LLMEngine) -> list[str]:
    """What is inconsistent right now: block references, and groups against their queues."""
    problems = engine.bm.audit()
    sched = engine.scheduler
    queues = {
        GroupStatus.WAITING: sched.waiting,
        GroupStatus.RUNNING: sched.running,
        GroupStatus.SWAPPED: sched.swapped,
    }
    for rid, group in engine.groups.items():
        held = [status for status, queue in queues.items() if group in queue]
        if held != [group.status]:
            problems.append(f"request {rid} is {group.status.name} but queued in {held}")
        if group.status is GroupStatus.RUNNING and not group.live_seqs:
            problems.append(f"request {rid} runs with no live sequence")
    queued = len(sched.waiting) + len(sched.running) + len(sched.swapped)
    if queued != len(engine.groups):
        problems.append(f"{queued} groups queued but {len(engine.groups)} unfinished")
    return problems


@dataclass
class Tally:
    requests: int = 0
    finished: int = 0
    errored: int = 0
    failed_by_others: int = 0  # requests of ordinary values that errored
    extreme: int = 0  # requests with values at the edge of the float range
    aborted: int = 0
    rejected: int = 0
    hung: int = 0
    leaked_blocks: int = 0
    steps: int = 0
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the errored requests' messages
    greedy_checked: int = 0
    greedy_mismatches: int = 0
    preemptions: dict[str, dict[str, int]] = field(
        default_factory=dict
    )  # per mode: swap / recompute


def _params(rng: random.Random, stops: list[str]) -> tuple[SamplingParams, bool]:
    """A request's sampling values, and whether they are extreme ones."""
    kind = rng.choice(("greedy", "greedy", "sampled", "n", "beam"))
    common_args: dict[str, Any] = dict(
        max_tokens=rng.randint(1, 24), stop=rng.sample(stops, rng.randint(0, 1))
    )
    if rng.random() < EXTREME_SHARE:
        if kind == "beam":
            return SamplingParams(
                beam_width=rng.randint(2, 4),
                length_penalty=rng.choice(BEAM_EXTREMES),
                **common_args,
            ), True
        n = rng.randint(2, 4) if kind == "n" else 1
        return SamplingParams(
            n=n, seed=rng.randrange(1000), **rng.choice(EXTREMES), **common_args
        ), True
    return _ordinary(rng, kind, common_args), False


def _ordinary(rng: random.Random, kind: str, common_args: dict[str, Any]) -> SamplingParams:
    if kind == "greedy":
        return SamplingParams(temperature=0, **common_args)
    if kind == "sampled":
        return SamplingParams(
            temperature=rng.choice((0.7, 1.0)),
            top_k=rng.choice((0, 20)),
            top_p=rng.choice((1.0, 0.9)),
            seed=rng.randrange(1000),
            **common_args,
        )
    if kind == "n":
        return SamplingParams(n=rng.randint(2, 4), seed=rng.randrange(1000), **common_args)
    return SamplingParams(beam_width=rng.randint(2, 4), **common_args)


def soak_mode(
    loaded: LoadedModel, mode: str, requests: int, seed: int = 0, tally: Tally | None = None
) -> Tally:
    """Run ``requests`` mixed requests on a fresh engine in preemption ``mode``."""
    tally = tally or Tally()
    rng = random.Random(seed)
    engine = make_engine(loaded, mode)
    vocab = loaded.config.vocab_size
    stops = [loaded.tokenizer.decode([t]) for t in rng.sample(range(3, vocab), 8)]
    stops = [s for s in stops if s.strip()]
    prefixes = [[rng.randrange(3, vocab) for _ in range(rng.choice((17, 32)))] for _ in range(2)]
    pins: dict[str, list[int]] = {}
    greedy: dict[str, tuple[list[int], SamplingParams]] = {}
    extreme: set[str] = set()
    outputs: dict[str, list[int]] = {}
    live: set[str] = set()
    folded = OutputAccumulator()
    submitted = 0
    limit = 40 * requests + 1000
    while (submitted < requests or engine.has_unfinished()) and tally.steps < limit:
        while submitted < requests and len(live) < IN_FLIGHT:
            prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 40))]
            if rng.random() < 0.3:
                prompt = rng.choice(prefixes) + prompt[:8]
            params, odd = _params(rng, stops)
            submitted += 1
            tally.requests += 1
            tally.extreme += odd
            try:
                rid = engine.add_request(prompt, params)
            except ValueError:
                tally.rejected += 1
                continue
            live.add(rid)
            if odd:
                extreme.add(rid)
            if params.greedy and params.n == 1 and not params.use_beam_search:
                greedy[rid] = (prompt, params)
        if rng.random() < 0.01 and len(pins) < 2:
            prefix = rng.choice(prefixes)
            pins[engine.pin_prefix(prefix)] = prefix
        if pins and rng.random() < 0.005:  # maybe before its pinning request is done
            rid = rng.choice(sorted(pins))
            del pins[rid]
            engine.unpin_prefix(rid)
        if live and rng.random() < 0.02:
            victim = rng.choice(sorted(live))
            if engine.abort(victim):
                folded.forget(victim)
                live.discard(victim)
                tally.aborted += 1
        for update in engine.step():
            if update.request_id not in live:
                continue
            out = folded.add(update)
            if out.finished:
                live.discard(out.request_id)
                tally.finished += 1
                if out.error is not None:
                    tally.errored += 1
                    tally.failed_by_others += out.request_id not in extreme
                    tally.errors.append(f"{mode}: {out.error}")
                outputs[out.request_id] = out.outputs[0].token_ids if out.outputs else []
        tally.steps += 1
        problems = audit(engine)
        if problems:
            tally.problems += [f"{mode} step {tally.steps}: {p}" for p in problems[:3]]
            break
    tally.hung += len(engine.groups)  # requests and pin requests that never ended
    s = engine.stats()
    tally.preemptions[mode] = {"swap": s.preemptions_swap, "recompute": s.preemptions_recompute}
    for rid in pins:
        engine.unpin_prefix(rid)
    leaked = s.blocks_used - s.blocks_pinned + s.blocks_swapped + engine.stats().blocks_used
    if leaked:
        tally.problems.append(
            f"{mode}: {leaked} blocks leaked (used {s.blocks_used}, pinned "
            f"{s.blocks_pinned}, swapped {s.blocks_swapped}, then "
            f"{engine.stats().blocks_used} used once unpinned)"
        )
    tally.leaked_blocks += leaked
    _check_greedy(loaded, mode, greedy, outputs, tally)
    return tally


def _check_greedy(loaded, mode, greedy, outputs, tally: Tally) -> None:
    """Rerun some finished greedy requests alone on a fresh engine: same tokens."""
    done = [rid for rid in greedy if rid in outputs][:GREEDY_CHECKS]
    alone = make_engine(loaded, mode)
    for rid in done:
        prompt, params = greedy[rid]
        got = alone.generate([prompt], params)[0].outputs[0].token_ids
        tally.greedy_checked += 1
        tally.greedy_mismatches += got != outputs[rid]


def run(loaded: LoadedModel, requests: int, seed: int = 0) -> dict:
    """``requests`` split over every preemption mode; the soak's summary."""
    tally = Tally()
    t0 = time.perf_counter()
    share = -(-requests // len(MODES))
    for i, mode in enumerate(MODES):
        n = min(share, requests - i * share)
        if n > 0:
            soak_mode(loaded, mode, n, seed + i, tally)
    serve = soak_serve.run(loaded, max(requests // SERVE_SHARE, 24), seed)
    return {
        "requests": tally.requests,
        "finished": tally.finished,
        "errored": tally.errored,
        "failed_by_others": tally.failed_by_others + serve["failed_by_others"],
        "extreme": tally.extreme,
        "hung": tally.hung,
        "leaked_blocks": tally.leaked_blocks,
        "steps": tally.steps,
        "seconds": round(time.perf_counter() - t0, 2),
        "aborted": tally.aborted,
        "rejected": tally.rejected,
        "problems": tally.problems,
        "errors": tally.errors[:10],
        "greedy_checked": tally.greedy_checked,
        "greedy_mismatches": tally.greedy_mismatches,
        "preemptions": tally.preemptions,
        "serve": serve,
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser("soak", "mixed requests through a small pool; every request must end", 1.0)
    p.add_argument("--requests", type=int, default=2000, help="requests in all (default 2000)")
    args = common.parse(p, argv)
    if args.requests < 1:
        p.error(f"--requests must be >= 1, got {args.requests}")
    loaded = common.load(args.model)
    common.say(f"soaking {args.requests} requests in modes {', '.join(MODES)}")
    result = run(tiny_model(loaded.tokenizer, args.seed), args.requests, args.seed)
    return common.emit(result, args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SoakResult:
    """What the report reads of a run's JSON."""

    requests: int
    steps: int
    seconds: float
    finished: int
    aborted: int
    rejected: int
    errored: int
    extreme: int
    hung: int
    leaked_blocks: int
    failed_by_others: int
    greedy_checked: int
    greedy_mismatches: int
    preemptions: dict[str, dict[str, int]]


# each a count that must be 0 (the goal's figure: the result's field)
ZERO_GOALS = (
    ("failed_by_others", "requests failed by another request's values"),
    ("hung", "requests that never ended"),
    ("leaked_blocks", "KV blocks left allocated after the soak"),
    ("greedy_mismatches", "greedy outputs unlike the same request run alone"),
)


def goals(k: SoakResult) -> list[Goal]:
    why = (
        f"{k.requests} requests under preemption (swap, recompute, auto), "
        f"{k.aborted} cancelled midway, {k.rejected} refused, {k.extreme} with "
        "extreme sampling values; the others must not notice"
    )
    rows = []
    for key, what in ZERO_GOALS:
        count = getattr(k, key)
        rows.append(Goal("soak", what, count, "0", count == 0, why))
        why = "the same run"
    return rows


def figures(r: SoakResult) -> list[str]:
    k = r.preemptions
    rows = [[mode, k[mode]["swap"], k[mode]["recompute"]] for mode in k]
    return [
        f"{r.requests} requests in {r.steps} engine steps ({r.seconds:.1f} s): "
        f"{r.finished} finished, {r.aborted} cancelled, {r.rejected} refused, "
        f"{r.errored} errored ({r.extreme} had extreme sampling values), "
        f"{r.hung} hung, {r.leaked_blocks} blocks leaked; "
        f"{r.greedy_mismatches} of {r.greedy_checked} greedy outputs differed.",
        "",
        table(["preemption mode", "swap preemptions", "recompute preemptions"], rows),
    ]


SECTION = Section(reader(SoakResult), goals, figures)
