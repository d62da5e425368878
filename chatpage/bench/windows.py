"""KV blocks of a long chat with sliding-window layers (issue 21 item 4): the block manager's own
accounting, no model run.

A Gemma-3-shaped layout (26 layers, 5 sliding : 1 full, window 512, as Gemma 3 1B's config) holds
an ``--tokens``-token chat, prefilled in the engine's chunks and then decoded, through the real
``BlockManager`` and ``kv_groups``; the same chat with every layer on full attention is the
baseline. Blocks are counted in layer-blocks (a page of ``page_layers`` layers is that many), so
the two layouts compare in bytes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from chatpage.bench.reporting import Goal, Section, at_most, reader, table
from chatpage.engine.config import EngineConfig
from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.block_table import Demand
from chatpage.engine.core.kv_groups import kv_groups
from chatpage.engine.core.sequence import Sequence
from chatpage.vocab import DEFAULT_BLOCK_SIZE

GOAL_RATIO = 0.35  # layer-blocks a Gemma 3-shaped model holds over full attention's


def gemma3_windows(layers: int = 26, window: int = 512, pattern: int = 6) -> list[int]:
    return [window if (i + 1) % pattern else 0 for i in range(layers)]


def peak_layer_blocks(windows: list[int], tokens: int, block_size: int, chunk: int) -> int:
    """The most layer-blocks one ``tokens``-token chat holds at once between steps."""
    groups = kv_groups(windows)
    bm = BlockManager(1 << 20, 0, block_size, enable_caching=False, windows=groups.windows)
    seq = Sequence(list(range(tokens)), tokens // 2, None)  # type: ignore[arg-type]
    peak = 0
    while seq.num_computed_tokens < tokens:
        first = seq.seq_id not in bm.tables
        k = min(
            chunk if seq.num_computed_tokens < seq.prompt_len else 1,
            tokens - seq.num_computed_tokens,
        )
        d = Demand(seq, k, bm.get_computed_blocks(seq) if first else None)
        assert bm.allocate_slots([d]) is not None
        seq.num_computed_tokens += k
        bm.commit(seq)
        peak = max(peak, bm.pool.num_used)
    return peak * groups.page_layers


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chatpage bench windows", description=__doc__)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--layers", type=int, default=26)
    p.add_argument("--block-size", type=int, default=DEFAULT_BLOCK_SIZE)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    chunk = EngineConfig().max_num_batched_tokens
    windows = gemma3_windows(args.layers, args.window)
    sliding = peak_layer_blocks(windows, args.tokens, args.block_size, chunk)
    full = peak_layer_blocks([0] * args.layers, args.tokens, args.block_size, chunk)
    result = {
        "tokens": args.tokens,
        "layers": args.layers,
        "window": args.window,
        "block_size": args.block_size,
        "layer_blocks_sliding": sliding,
        "layer_blocks_full": full,
        "ratio": round(sliding / full, 4),
    }
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
    return 0


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class WindowsResult:
    """A run's JSON."""

    tokens: int
    layers: int
    window: int
    block_size: int
    layer_blocks_sliding: int
    layer_blocks_full: int
    ratio: float


def goals(w: WindowsResult) -> list[Goal]:
    return [
        at_most(
            "windows",
            f"KV layer-blocks, Gemma 3 shape / full attention, {w.tokens}-token chat",
            w.ratio,
            GOAL_RATIO,
            f"{w.layer_blocks_sliding} against {w.layer_blocks_full} layer-blocks: each "
            f"sliding layer keeps only the blocks of its last {w.window} tokens",
        )
    ]


def figures(r: WindowsResult) -> list[str]:
    return [
        f"One {r.tokens}-token chat through the real block manager, no model run: "
        f"{r.layers} layers, 5 sliding (window {r.window}) : 1 full, as Gemma 3 1B; "
        f"block size {r.block_size}; the peak between steps in layer-blocks.",
        "",
        table(
            ["layout", "layer-blocks held", "ratio"],
            [
                [f"full attention, {r.layers} layers", r.layer_blocks_full, 1.0],
                ["Gemma 3 shape, sliding blocks freed", r.layer_blocks_sliding, r.ratio],
            ],
        ),
    ]


# no model run: none of the report's --bench-args
SECTION = Section(reader(WindowsResult), goals, figures, own_args=True)
