"""CUDA graphs for decode steps: capture once per batch size, replay with the step's inputs.

A decode step launches hundreds of small kernels; on a GPU their launch cost, not the arithmetic,
bounds a small batch. A CUDA graph records the launches of one step once and replays them in one
call, but a replay reads and writes the same memory it was captured with, at the same shapes. So:

- `GraphPlan` (plain bookkeeping, testable on the CPU) owns static input buffers sized for the
  largest captured batch, picks the captured size ("bucket") for a batch of ``n`` decode rows
  (the smallest one >= n), and writes a batch into the buffers padded up to that size: a padded
  row reads token 0 at position 0 through block 0 with a context of one token and stores nothing
  (slot -1); its logits are dropped. A batch larger than every bucket, one with a block table
  wider than the buffers, or one that is not all decode runs eagerly.
- `DecodeGraphs` captures ``model.forward`` over views of those buffers per bucket on first use
  (`cuda_capture`: the only code here that needs CUDA) and replays it afterwards. The graphs hold
  the KV cache's and the weights' addresses: a new cache (another ``key``) or `invalidate` drops
  them, and a capture that fails turns the graphs off for good, leaving eager steps. On the CPU
  the same bookkeeping runs with a capture that replays by running the forward again (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


@dataclass(frozen=True)
class StaticInputs:
    """Views of the static buffers for one bucket of ``size`` rows (what a graph is captured on)."""

    input_ids: torch.Tensor  # [size] int64
    positions: torch.Tensor  # [size] int64
    slot_mapping: torch.Tensor  # [size] int64
    block_tables: torch.Tensor  # [size, max_blocks] int32
    seq_lens: torch.Tensor  # [size] int32
    query_start_loc: torch.Tensor  # [size + 1] int32
    logit_rows: torch.Tensor  # [size] int64


class GraphPlan:
    """Buckets, static buffers and padding for graphed decode steps (no CUDA calls)."""

    def __init__(
        self,
        max_batch: int,
        max_blocks: int,
        block_size: int,
        device: torch.device | str = "cpu",
        buckets: Sequence[int] = DEFAULT_BUCKETS,
    ) -> None:
        sizes = sorted({b for b in buckets if 0 < b <= max_batch})
        if not sizes:
            raise ValueError(f"no CUDA graph bucket fits a batch of {max_batch}")
        self.buckets = tuple(sizes)
        self.max_blocks = max_blocks
        self.block_size = block_size
        top = self.buckets[-1]

        def buf(*shape: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=device)

        self._ids = buf(top, dtype=torch.int64)
        self._positions = buf(top, dtype=torch.int64)
        self._slots = buf(top, dtype=torch.int64)
        self._tables = buf(top, max_blocks, dtype=torch.int32)
        self._lens = buf(top, dtype=torch.int32)
        self._starts = torch.arange(top + 1, dtype=torch.int32, device=device)  # one row each
        self._rows = torch.arange(top, dtype=torch.int64, device=device)  # every row samples

    def bucket(self, n: int) -> int | None:
        """The smallest captured size holding ``n`` rows, or None (too many: run eagerly)."""
        for size in self.buckets:
            if size >= n:
                return size
        return None

    def fits(self, n: int, widest_table: int) -> bool:
        """Whether a decode batch of ``n`` rows whose longest block table has ``widest_table``
        blocks can replay a graph."""
        return 0 < n and self.bucket(n) is not None and widest_table <= self.max_blocks

    def inputs(self, size: int) -> StaticInputs:
        """The buffers' views for bucket ``size`` (the same memory on every call)."""
        return StaticInputs(
            self._ids[:size],
            self._positions[:size],
            self._slots[:size],
            self._tables[:size],
            self._lens[:size],
            self._starts[: size + 1],
            self._rows[:size],
        )

    def fill(
        self, token_ids: Sequence[int], positions: Sequence[int], tables: Sequence[Sequence[int]]
    ) -> int:
        """Write one decode batch (a token, its position and the block table per sequence) into
        the buffers, padded to its bucket; return the bucket size."""
        n = len(token_ids)
        widest = max(len(t) for t in tables)
        if not self.fits(n, widest):
            raise ValueError(
                f"a decode batch of {n} rows with {widest}-block tables does not fit "
                f"the CUDA graph buffers (at most {self.buckets[-1]} rows, "
                f"{self.max_blocks} blocks)"
            )
        size = self.bucket(n)
        assert size is not None
        pos = torch.tensor(positions, dtype=torch.int64)
        table_rows = torch.zeros(n, self.max_blocks, dtype=torch.int32)
        for i, table in enumerate(tables):
            table_rows[i, : len(table)] = torch.tensor(table, dtype=torch.int32)
        owned = table_rows[torch.arange(n), pos // self.block_size].long()
        padding = size - n
        self._ids[:size].copy_(
            torch.cat(
                [
                    torch.tensor(token_ids, dtype=torch.int64),
                    torch.zeros(padding, dtype=torch.int64),
                ]
            )
        )
        self._positions[:size].copy_(torch.cat([pos, torch.zeros(padding, dtype=torch.int64)]))
        self._slots[:size].copy_(
            torch.cat(
                [
                    owned * self.block_size + pos % self.block_size,
                    torch.full((padding,), -1, dtype=torch.int64),
                ]
            )
        )
        self._tables[:size].copy_(
            torch.cat([table_rows, torch.zeros(padding, self.max_blocks, dtype=torch.int32)])
        )
        self._lens[:size].copy_(
            torch.cat([(pos + 1).int(), torch.ones(padding, dtype=torch.int32)])
        )
        return size


Forward = Callable[[StaticInputs], torch.Tensor]
Replay = Callable[[], None]
Capture = Callable[[Forward, StaticInputs, object], tuple[Replay, torch.Tensor, object]]
"""(forward, inputs, pool) -> (replay, logits, pool): record ``forward(inputs)`` once; each
``replay()`` recomputes ``logits`` in place from the buffers' current contents."""


def cuda_capture(
    forward: Forward, inputs: StaticInputs, pool: Any
) -> tuple[Replay, torch.Tensor, object]:
    # pool: what an earlier capture's graph.pool() returned (torch's private _POOL_HANDLE)
    """Capture ``forward(inputs)`` in a CUDA graph (after one warm-up run on a side stream, so
    lazy initialisations stay out of it), in memory pool ``pool`` (None: a new one)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        forward(inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        logits = forward(inputs)
    return graph.replay, logits, graph.pool()


class DecodeGraphs:
    """Captured decode steps per bucket over one `GraphPlan`, for one KV cache (``key``)."""

    def __init__(
        self,
        plan: GraphPlan,
        forward: Forward,
        warn: Callable[[str], None],
        capture: Capture = cuda_capture,
    ) -> None:
        self.plan = plan
        self._forward = forward  # runs the model on a bucket's StaticInputs, returns its logits
        self._capture = capture
        self._warn = warn
        self._graphs: dict[int, tuple[Replay, torch.Tensor]] = {}
        self._pool: object = None  # one memory pool shared by every bucket's graph
        self._key: object = None
        self.enabled = True

    @property
    def captured(self) -> tuple[int, ...]:
        """The bucket sizes captured so far."""
        return tuple(sorted(self._graphs))

    def invalidate(self) -> None:
        """Forget every captured graph (they point at a KV cache or weights that changed)."""
        self._graphs.clear()
        self._pool = None

    def run(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        tables: Sequence[Sequence[int]],
        key: object,
    ) -> torch.Tensor | None:
        """Logits [n, vocab] of one decode batch through its bucket's graph (captured now if
        needed), or None when the batch does not fit or graphs are off: run it eagerly.
        ``key`` names what the graphs point at (the KV cache's tensors): when it changes, every
        graph is captured again."""
        n = len(token_ids)
        if not self.enabled or not self.plan.fits(n, max(len(t) for t in tables)):
            return None
        if key != self._key:
            self.invalidate()
            self._key = key
        size = self.plan.fill(token_ids, positions, tables)
        if size not in self._graphs:
            try:
                replay, logits, self._pool = self._capture(
                    self._forward, self.plan.inputs(size), self._pool
                )
            except RuntimeError as e:  # e.g. an op that cannot be captured: eager from now on
                self.enabled = False
                self.invalidate()
                self._warn(f"CUDA graphs are off (capture failed: {str(e).splitlines()[0]})")
                return None
            self._graphs[size] = (replay, logits)
        replay, logits = self._graphs[size]
        replay()
        return logits[:n]
