"""KV memory utilization (the paper's Figure 2): the share of KV memory holding live token states.

One ShareGPT-shaped trace, one KV budget, the same FCFS iteration-level scheduling for everyone:

* chatpage: the real engine runs the trace; after every step the live token states (computed
  tokens of running sequences) are divided by the memory its blocks occupy
  (``blocks_used * block_size``);
* Max / Pow2 / Oracle: contiguous reservations (see reservation.py), simulated at the token level
  under the same budget, sequence limit and token budget; the denominator is the reserved slots
  plus any free memory left unusable by external fragmentation.

Utilization is averaged over iterations (steps). Reported as fractions, with each policy's mean and
maximum batch.

``kv_capacity``: what one GiB of KV cache holds for the model with a bf16 and with an int8 cache
(``--kv-cache-dtype``), read off real engines' pools: the bytes of a block, the blocks, and the
4k-token chats that fit at once (goal: int8 at least 1.9x bf16's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from chatpage.bench import common, plots
from chatpage.bench.reporting import Goal, Section, at_least, reader, table
from chatpage.bench.reservation import POLICIES, simulate
from chatpage.bench.workloads import SHAREGPT, describe, make_trace, max_len_at
from chatpage.engine import SamplingParams

DEFAULT_SCALE = 1.0
REQUESTS_AT_SCALE_1 = 24
MAX_SLABS = 3  # the default budget holds this many Max reservations
GOAL_UTILIZATION = 0.97  # chatpage's KV memory holding token states, averaged over steps
CAPACITY_BYTES = 1 << 30  # the KV budget the capacity figures are for
CHAT_TOKENS = 4096
GOAL_INT8_CAPACITY = 1.9  # int8's 4k-token chats in the budget against bf16's


def kv_capacity(loaded, block_size: int) -> dict:
    """Blocks and concurrent 4k-token chats in :data:`CAPACITY_BYTES` of bf16 and of int8 KV."""
    out: dict = {"budget_bytes": CAPACITY_BYTES, "chat_tokens": CHAT_TOKENS}
    for dtype in ("bf16", "int8"):
        eng = common.engine(
            loaded,
            kv_cache_dtype=dtype,
            kv_cache_bytes=CAPACITY_BYTES,
            swap_space_bytes=0,
            block_size=block_size,
        )
        stats = eng.stats()
        per_chat = -(-CHAT_TOKENS // block_size)
        out[dtype] = {
            "bytes_per_block": stats.bytes_per_block,
            "blocks": stats.num_blocks,
            "chats": stats.num_blocks // per_chat,
        }
        del eng
    out["int8_vs_bf16_chats"] = out["int8"]["chats"] / out["bf16"]["chats"]
    out["goal"] = GOAL_INT8_CAPACITY
    out["met"] = out["int8_vs_bf16_chats"] >= GOAL_INT8_CAPACITY
    return out


def run_chatpage(loaded, trace, blocks: int, block_size: int) -> dict:
    eng = common.engine(loaded, blocks=blocks, block_size=block_size)
    log = common.record_batches(eng)
    samples: list[float] = []
    used_blocks: list[int] = []

    def on_step(e, _outs) -> None:
        used = e.stats().blocks_used - e.stats().blocks_pinned
        if used:
            samples.append(common.live_tokens(e) / (used * block_size))
            used_blocks.append(used)

    t0 = common.now()
    for r in trace:
        eng.add_request(
            r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)
        )
    common.drain(eng, on_step)
    stats = eng.stats()
    batches = [n for n, _ in log]
    return {
        "utilization": statistics.fmean(samples),
        "mean_batch": statistics.fmean(batches),
        "max_batch": max(batches),
        "iterations": len(batches),
        "seconds": common.now() - t0,
        "preemptions": stats.preemptions_recompute + stats.preemptions_swap,
        "mean_blocks_used": statistics.fmean(used_blocks),
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser(
        "memory", "KV memory utilization: paged blocks vs contiguous reservations", DEFAULT_SCALE
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"number of requests (default {REQUESTS_AT_SCALE_1} x scale, at least 4)",
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help=f"KV budget in tokens (default {MAX_SLABS} x the Max reservation)",
    )
    p.add_argument(
        "--max-len",
        type=int,
        default=None,
        help="the Max policy's reservation (default 2048 x scale)",
    )
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--plot", default=None, help="write a PNG bar chart here")
    args = common.parse(p, argv)
    n = args.requests or max(4, round(REQUESTS_AT_SCALE_1 * args.scale))
    max_len = args.max_len or max_len_at(args.scale)
    budget = args.kv_tokens or MAX_SLABS * max_len
    blocks = budget // args.block_size
    budget = blocks * args.block_size

    loaded = common.load(args.model)
    trace = make_trace(
        SHAREGPT, n, scale=args.scale, seed=args.seed, vocab_size=loaded.config.vocab_size
    )
    shape = describe(trace)
    common.say(f"trace: {shape}; budget {budget} tokens ({blocks} blocks), Max reserves {max_len}")
    common.say("chatpage: running the trace on the engine")
    mine = run_chatpage(loaded, trace, blocks, args.block_size)
    result = {
        "benchmark": "memory",
        "workload": "sharegpt",
        "scale": args.scale,
        "seed": args.seed,
        **common.model_info(loaded),
        **shape,
        "kv_budget_tokens": budget,
        "block_size": args.block_size,
        "max_policy_len": max_len,
        "chatpage_utilization": mine["utilization"],
        "chatpage_mean_batch": mine["mean_batch"],
        "chatpage_max_batch": mine["max_batch"],
        "chatpage_iterations": mine["iterations"],
        "chatpage_preemptions": mine["preemptions"],
        "chatpage_seconds": mine["seconds"],
    }
    for policy in POLICIES:
        sim = simulate(trace, policy, budget, max_len=max_len)
        result[f"{policy}_utilization"] = sim.utilization
        result[f"{policy}_mean_batch"] = sim.mean_batch
        result[f"{policy}_max_batch"] = sim.max_batch
        result[f"{policy}_iterations"] = sim.iterations
        result[f"{policy}_reserved_unused"] = sim.reserved_share
        result[f"{policy}_external_fragmentation"] = sim.external_share
        common.say(f"{policy}: utilization {sim.utilization:.3f}, mean batch {sim.mean_batch:.1f}")
    result["goal_chatpage_utilization"] = GOAL_UTILIZATION
    common.say("KV capacity of 1 GiB, bf16 and int8")
    result["kv_capacity"] = kv_capacity(loaded, args.block_size)
    if args.plot:
        result["plot"] = plots.memory(result, args.plot)
    return common.emit(common.round_floats(result), args.json)


@dataclass(frozen=True)
class MemoryResult:
    """What the report reads of a run's JSON (each policy's utilization and batches)."""

    requests: int
    scale: float
    mean_input: float
    mean_output: float
    kv_budget_tokens: int
    block_size: int
    max_policy_len: int
    chatpage_utilization: float
    chatpage_mean_batch: float
    chatpage_max_batch: int
    max_utilization: float
    max_mean_batch: float
    max_max_batch: int
    pow2_utilization: float
    pow2_mean_batch: float
    pow2_max_batch: int
    oracle_utilization: float
    oracle_mean_batch: float
    oracle_max_batch: int
    kv_capacity: dict | None = None  # runs before issue 44 did not measure it


def goals(m: MemoryResult) -> list[Goal]:
    live = m.mean_input + m.mean_output / 2
    why = (
        f"paged blocks waste only the unfilled tail of each sequence's last block "
        f"(block size {m.block_size}, about {m.block_size / 2:.0f} slots per sequence "
        f"against ~{live:.0f} live tokens); reservations hold slots for tokens not yet "
        f"generated (Oracle), rounding (Pow2) or the maximum length (Max)"
    )
    u = m.chatpage_utilization
    rows = [at_least("memory", "chatpage KV utilization", u, GOAL_UTILIZATION, why)]
    if m.kv_capacity is not None:
        c = m.kv_capacity
        rows.append(
            at_least(
                "memory",
                "4k-token chats in 1 GiB, int8 / bf16 KV",
                c["int8_vs_bf16_chats"],
                GOAL_INT8_CAPACITY,
                f"{c['int8']['chats']} chats ({c['int8']['blocks']} blocks of "
                f"{c['int8']['bytes_per_block']} bytes) against {c['bf16']['chats']} "
                f"({c['bf16']['blocks']} of {c['bf16']['bytes_per_block']})",
            )
        )
    return rows


def figures(r: MemoryResult) -> list[str]:
    rows = [
        [
            label,
            100 * getattr(r, f"{k}_utilization"),
            getattr(r, f"{k}_mean_batch"),
            getattr(r, f"{k}_max_batch"),
        ]
        for label, k in (
            ("Max", "max"),
            ("Pow2", "pow2"),
            ("Oracle", "oracle"),
            ("chatpage", "chatpage"),
        )
    ]
    capacity = []
    if r.kv_capacity is not None:
        c = r.kv_capacity
        capacity = [
            "",
            f"What 1 GiB of KV cache holds (engines' pools; {c['chat_tokens']}-token chats):",
            "",
            table(
                ["KV cache", "bytes a block", "blocks", "chats at once"],
                [
                    [d, c[d]["bytes_per_block"], c[d]["blocks"], c[d]["chats"]]
                    for d in ("bf16", "int8")
                ],
            ),
        ]
    return [
        f"{r.requests} ShareGPT-shaped requests at scale {r.scale} (mean input "
        f"{r.mean_input}, output {r.mean_output}), KV budget "
        f"{r.kv_budget_tokens} tokens, Max reserves {r.max_policy_len}.",
        "",
        table(["policy", "KV memory holding token states (%)", "mean batch", "max batch"], rows),
        *capacity,
    ]


SECTION = Section(reader(MemoryResult), goals, figures, plotted=True)
