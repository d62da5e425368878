"""Turns a scheduled batch into tensors (positions, slot mapping, block tables), runs the model.

On CUDA a batch of decode rows replays a captured CUDA graph of the step
(`chatpage.engine.model.cuda_graphs`) when it fits one; everything else runs eagerly.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from chatpage.engine.config import EngineConfig
from chatpage.engine.core.step import ScheduledSeq
from chatpage.engine.device import GpuMemory, kv_pool_bytes, measure_memory
from chatpage.engine.model.cuda_graphs import (
    Capture,
    DecodeGraphs,
    GraphPlan,
    StaticInputs,
    cuda_capture,
)
from chatpage.engine.model.kv_cache import KVCache, bytes_per_block, row_size
from chatpage.engine.model.llama import AttentionMetadata, LlamaModel

DEFAULT_GRAPH_BATCH = 128
"""The largest decode batch replayed through a CUDA graph (larger ones run eagerly)."""


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        kv: KVCache,
        tables: Seq[Mapping[int, list[int]]],
        block_size: int,
        warnings: list[str] | None = None,
        graphs: bool = True,
    ) -> None:
        self.model = model
        self.kv = kv
        # the block manager's tables of KV group 0, then of groups 1, 2, ...
        # (``engine/core/kv_groups.py``), by sequence id; read-only here
        self.tables, *self.group_tables = tables
        self.block_size = block_size
        self.warnings: list[str] = [] if warnings is None else warnings  # (the engine's list)
        self.graphs: DecodeGraphs | None = None
        if model.device.type == "cuda" and graphs and not self.group_tables:
            self.use_graphs(cuda_capture)

    def use_graphs(self, capture: Capture) -> None:
        """Replay decode steps through graphs made by ``capture`` (CUDA: `cuda_capture`; a test
        may run the same bookkeeping on the CPU with a capture that replays eagerly)."""
        max_blocks = -(-self.model.max_positions // self.block_size)
        plan = GraphPlan(DEFAULT_GRAPH_BATCH, max_blocks, self.block_size, self.model.device)
        self.graphs = DecodeGraphs(plan, self._graph_forward, self.warnings.append, capture)

    def _graph_forward(self, inputs: StaticInputs) -> torch.Tensor:
        meta = AttentionMetadata(
            slot_mapping=inputs.slot_mapping,
            block_tables=inputs.block_tables,
            seq_lens=inputs.seq_lens,
            query_start_loc=inputs.query_start_loc,
        )
        return self.model.forward(
            inputs.input_ids, inputs.positions, meta, self.kv.k, self.kv.v, inputs.logit_rows
        )

    def _replay(self, batch: list[ScheduledSeq]) -> torch.Tensor | None:
        """The logits of ``batch`` through a CUDA graph, or None (not all decode rows, or no
        graph fits it)."""
        if self.graphs is None or not all(i.num_new_tokens == 1 and i.samples for i in batch):
            return None
        seqs = [item.seq for item in batch]
        return self.graphs.run(
            [s.token_ids[s.num_computed_tokens] for s in seqs],
            [s.num_computed_tokens for s in seqs],
            [self.tables[s.seq_id] for s in seqs],
            key=(self.kv.k[0].data_ptr(), self.kv.v[0].data_ptr()),
        )

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Run one step; logits [R, V] for the entries of ``batch`` whose ``samples`` is true
        (a drafted entry's every row, ``ScheduledSeq.logit_rows``)."""
        replayed = self._replay(batch)
        if replayed is not None:
            return replayed
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        starts = [0]
        lens: list[int] = []
        tables: list[list[int]] = []
        logit_rows: list[int] = []
        for item in batch:
            seq, k = item.seq, item.num_new_tokens
            c = seq.num_computed_tokens
            ids += seq.token_ids[c : c + k - len(item.draft)] + list(item.draft)
            positions += range(c, c + k)
            starts.append(starts[-1] + k)
            lens.append(c + k)
            tables.append(self.tables[seq.seq_id])
            logit_rows += range(starts[-1] - item.logit_rows, starts[-1])
        pos = torch.tensor(positions, dtype=torch.int64)
        q_lens = torch.tensor([b - a for a, b in zip(starts, starts[1:], strict=False)])
        owner = torch.repeat_interleave(torch.arange(len(batch)), q_lens)
        block, offset = pos // bs, pos % bs

        def group(tables: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            """One KV group's slot mapping and padded block tables."""
            width = max(len(t) for t in tables)
            padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
            return padded[owner, block].long() * bs + offset, padded

        slot_mapping, block_tables = group(tables)
        others = [group([g[item.seq.seq_id] for item in batch]) for g in self.group_tables]
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            block_tables=block_tables,
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            group_slots=tuple(s for s, _ in others),
            group_tables=tuple(t for _, t in others),
        )
        device = self.model.device
        if device.type != "cpu":
            meta = meta.to(device)
            pos = pos.to(device)
        return self.model.forward(
            torch.tensor(ids, dtype=torch.int64, device=device),
            pos,
            meta,
            self.kv.k,
            self.kv.v,
            torch.tensor(logit_rows, dtype=torch.int64, device=device),
        )


@torch.inference_mode()
def profile_step(
    model: LlamaModel, config: EngineConfig, max_model_len: int, kv_dtype: torch.dtype
) -> GpuMemory:
    """The GPU's memory around the largest step the scheduler can make: one prompt of
    ``max_num_batched_tokens`` tokens with logits (and their log-softmax, as the sampler takes)
    for up to ``max_num_seqs`` rows, run on a scratch cache just large enough; what it allocated
    above the weights is the activation peak the KV pool must leave room for."""
    device = model.device
    bs = config.block_size
    tokens = max(1, min(config.max_num_batched_tokens, max_model_len - 1))
    blocks = -(-tokens // bs)
    shape = (blocks, bs, model.num_kv_heads, row_size(model.head_dim, kv_dtype))
    k = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
    v = [torch.zeros(shape, dtype=kv_dtype, device=device) for _ in range(model.num_layers)]
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(tokens, dtype=torch.int64, device=device),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=device).unsqueeze(0),
        seq_lens=torch.tensor([tokens], dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0, tokens], dtype=torch.int32, device=device),
    )
    rows = torch.arange(tokens - min(tokens, config.max_num_seqs), tokens, device=device)
    logits = model.forward(
        torch.zeros(tokens, dtype=torch.int64, device=device),
        torch.arange(tokens, device=device),
        meta,
        k,
        v,
        rows,
    )
    torch.log_softmax(logits, dim=-1)
    del logits, k, v, meta
    return measure_memory(str(device), before)


def kv_pool_blocks(
    model: LlamaModel,
    config: EngineConfig,
    max_model_len: int,
    kv_dtype: torch.dtype,
    block_bytes: int,
) -> int:
    """How many ``block_bytes`` blocks the device's KV pool holds: ``config.kv_cache_bytes``
    of them on the CPU; on a GPU ``config.gpu_blocks``, or (unset) what
    ``gpu_memory_utilization`` leaves beside the largest step (`profile_step`). Raises
    ValueError for a pool that holds no block."""
    pool_bytes = config.kv_cache_bytes
    if model.device.type == "cuda" and config.gpu_blocks:
        pool_bytes = config.gpu_blocks * block_bytes
    elif model.device.type == "cuda":
        pool_bytes = kv_pool_bytes(
            profile_step(model, config, max_model_len, kv_dtype),
            config.gpu_memory_utilization,
            block_bytes,
        )
    num_blocks = pool_bytes // block_bytes
    if num_blocks < 1:
        raise ValueError(
            f"EngineConfig.kv_cache_bytes={config.kv_cache_bytes} holds no block "
            f"(one block is {block_bytes} bytes); raise the KV cache size"
        )
    return num_blocks


@dataclass(frozen=True)
class KVSizing:
    """The paged KV pool an engine runs with, and the context that pool allows."""

    block_bytes: int  # one block of every layer that pages, K and V
    num_blocks: int  # the device's pool
    num_cpu_blocks: int  # the swap pool
    freed: tuple[int, ...]  # per KV group: its window where blocks outside it are freed, else 0
    max_model_len: int  # the model's, or less where the rotary tables would outweigh the pool
    positions: int  # how far the rotary tables must reach
    note: str | None  # why the context is shorter than the model's


def size_kv(
    model: LlamaModel, config: EngineConfig, max_model_len: int, kv_dtype: torch.dtype
) -> KVSizing:
    """Size the pools for ``model`` under ``config`` (`kv_pool_blocks`), and how far positions
    reach: a group that keeps every block caps them by the pool; where every layer slides and
    frees, the pool does not bound a sequence, so the rotary tables are kept within its size."""
    groups = model.kv_groups
    block_bytes = bytes_per_block(
        groups.page_layers, config.block_size, model.num_kv_heads, model.head_dim, kv_dtype
    )
    num_blocks = kv_pool_blocks(model, config, max_model_len, kv_dtype, block_bytes)
    freed = groups.windows if config.free_outside_window else (0,) * groups.num_groups
    note = None
    if 0 in freed:  # a sequence holds every block of such a group: it never passes the pool
        positions = min(max_model_len, num_blocks * config.block_size)
    else:
        fits = num_blocks * block_bytes // (2 * model.head_dim * model.dtype.itemsize)
        if fits < max_model_len:
            note = (
                f"the context is {fits} tokens, not the model's {max_model_len}: "
                "longer rotary tables would outweigh the KV cache (--kv-cache raises it)"
            )
            max_model_len = fits
        positions = max_model_len
    return KVSizing(
        block_bytes,
        num_blocks,
        config.swap_space_bytes // block_bytes,
        freed,
        max_model_len,
        positions,
        note,
    )
