"""`chatpage bench kv`: decode over an int8 KV cache against bf16, in one run.

Two engines over the same weights (the app's int4 unless ``--weights``), one with a bf16 KV cache,
one with int8 (``--kv-cache-dtype``), each given the same ``--context``-token random prompts
(4,096 tokens at scale 1). For each batch of 32, 8 and 1 sequences both engines prefill their
prompts (the batches of 8 and 1 take the first of the 32 prompts, so they find them in the prefix
cache: prefilling 4k-token prompts is most of the run), then decode steps are timed in turn (one bf16 step, one int8 step, ...), so that both see
the same background load; a rate is the batch over the median step (speculation is off: every
timed step makes one token of each sequence, and the run checks it). Goal: int8 at least 1.25x
bf16's decode tok/s at batch 1 and 8, never below 1.0x.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from chatpage.bench import common
from chatpage.bench.reporting import Goal, Section, at_least, reader, table
from chatpage.engine import LLMEngine, SamplingParams
from chatpage.engine.load.loader import load_model
from chatpage.vocab import DEFAULT_WEIGHTS

BATCHES = (1, 8, 32)
CONTEXT = 4096
STEPS = 12  # timed decode steps per engine and batch
PREFILL_TOKENS = 2048  # a step's tokens
BLOCK_SIZE = 16
GOAL_SPEEDUP = 1.25  # at batch 1 and 8
FLOOR = 1.0  # at every batch
DTYPES = ("bf16", "int8")


def prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(batch)]


def decoding(eng: LLMEngine, ids: list[list[int]], room: int) -> list[str]:
    """Submit ``ids`` and step ``eng`` until every sequence has its prompt in the cache; returns
    the request ids. Each asks for ``room`` tokens, what the run may take (the first prompts decode
    while the last prefill, then the timed steps): every sequence still decodes in every timed
    step, and the run aborts them."""
    params = SamplingParams(temperature=0, max_tokens=room, ignore_eos=True)
    rids = [eng.add_request(prompt, params) for prompt in ids]
    while eng.scheduler.waiting or any(
        s.num_computed_tokens < s.prompt_len for g in eng.scheduler.running for s in g.seqs
    ):
        eng.step()
    return rids


def step_ms(eng: LLMEngine, batch: int) -> float:
    """One decode step's time; it must make one token of each of the ``batch`` sequences (the
    rate is the batch over the step: no drafted tokens, no sequence idle)."""
    made = eng.num_generated
    t0 = common.now()
    eng.step()
    elapsed = common.now() - t0
    assert eng.num_generated - made == batch, "a timed step made other than one token a sequence"
    return elapsed * 1e3


def run_batch(engines: dict[str, LLMEngine], ids: list[list[int]], room: int) -> dict:
    batch, context = len(ids), len(ids[0])
    requests = {}
    for dtype, eng in engines.items():
        requests[dtype] = decoding(eng, ids, room)
        eng.step()  # the first decode step (warm)
    times: dict[str, list[float]] = {d: [] for d in engines}
    for _ in range(STEPS):
        for dtype, eng in engines.items():
            assert len(eng.scheduler.running) == batch, "a sequence left the timed batch"
            times[dtype].append(step_ms(eng, batch))
    for dtype, eng in engines.items():
        for rid in requests[dtype]:
            eng.abort(rid)
    row: dict = {"batch": batch, "context": context}
    for dtype, samples in times.items():
        row[f"{dtype}_step_ms"] = statistics.median(samples)
        row[f"{dtype}_tok_s"] = batch * 1e3 / statistics.median(samples)
    row["speedup"] = row["int8_tok_s"] / row["bf16_tok_s"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = common.parser("kv", "decode tok/s over an int8 KV cache against bf16, one run", 1.0)
    p.add_argument("--weights", default=DEFAULT_WEIGHTS, help="the weights' format (default int4)")
    p.add_argument(
        "--batches",
        type=lambda v: tuple(sorted({int(b) for b in v.split(",")})),
        default=BATCHES,
        help="comma-separated batch sizes (default 1,8,32)",
    )
    args = common.parse(p, argv)
    batches = args.batches
    context = max(64, round(CONTEXT * args.scale))
    loaded = load_model(args.model, progress=common.say, weights=args.weights)
    # each sequence's prompt, what it decodes while the others prefill, and the timed steps
    room = -(-max(batches) * context // PREFILL_TOKENS) + 2 * STEPS + 16
    blocks = max(batches) * -(-(context + room) // BLOCK_SIZE)
    engines = {}
    for dtype in DTYPES:
        engines[dtype] = eng = common.engine(
            loaded,
            blocks=blocks,
            block_size=BLOCK_SIZE,
            weight_dtype=args.weights,
            kv_cache_dtype=dtype,
            gpu_blocks=blocks,  # (on a GPU: the same pool, not a share of its memory)
            num_speculative_tokens=0,  # a step is one token of every sequence: rate = batch / step
            max_num_seqs=max(batches),
            max_num_batched_tokens=PREFILL_TOKENS,
        )
        common.say(f"{dtype}: {eng.kv.format.describe()}, {eng.block_bytes} bytes a block")
    ids = prompts(max(batches), context, loaded.config.vocab_size, args.seed)
    rows: list[dict] = []
    for batch in sorted(batches, reverse=True):
        common.say(f"batch {batch}: {batch} prompts of {context} tokens, then decode")
        rows.insert(0, run_batch(engines, ids[:batch], room))
        common.say(f"batch {batch}: int8 {rows[0]['speedup']:.2f}x bf16")
    by_batch = {r["batch"]: r["speedup"] for r in rows}
    result = {
        "benchmark": "kv",
        **common.model_info(loaded),
        "weights": args.weights,
        "context": context,
        "int8_calibration_kld": engines["int8"].int8_kv_loss.kld,
        "rows": rows,
        "goal_speedup": GOAL_SPEEDUP,
        "met": all(by_batch.get(b, 0) >= GOAL_SPEEDUP for b in (1, 8))
        and min(by_batch.values()) >= FLOOR,
    }
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class KVRow:
    batch: int
    context: int
    bf16_step_ms: float
    bf16_tok_s: float
    int8_step_ms: float
    int8_tok_s: float
    speedup: float


@dataclass(frozen=True)
class KVResult:
    weights: str
    context: int
    int8_calibration_kld: float
    rows: list[KVRow]
    goal_speedup: float


def goals(r: KVResult) -> list[Goal]:
    why = (
        f"{r.weights} weights, {r.context}-token contexts; bf16 {{bf16:.1f}} tok/s against int8 "
        f"{{int8:.1f}} (the median of {STEPS} steps each, taken in turn)"
    )
    return [
        at_least(
            "kv",
            f"int8 / bf16 KV decode tok/s, batch {row.batch}",
            row.speedup,
            r.goal_speedup if row.batch in (1, 8) else FLOOR,
            why.format(bf16=row.bf16_tok_s, int8=row.int8_tok_s),
        )
        for row in r.rows
    ]


def figures(r: KVResult) -> list[str]:
    rows = [
        [x.batch, x.bf16_step_ms, x.bf16_tok_s, x.int8_step_ms, x.int8_tok_s, x.speedup]
        for x in r.rows
    ]
    header = [
        "batch",
        "bf16 step (ms)",
        "bf16 tok/s",
        "int8 step (ms)",
        "int8 tok/s",
        "int8 / bf16",
    ]
    return [
        f"Decode over {r.context}-token contexts, {r.weights} weights, a bf16 and an int8 KV cache "
        f"in one run (the int8 engine's calibration: mean KLD {r.int8_calibration_kld:.4f} "
        "against bf16 KV).",
        "",
        table(header, rows),
    ]


SECTION = Section(reader(KVResult), goals, figures)
