"""Turns a scheduled batch into tensors (positions, slot mapping, block tables), runs the model."""

from __future__ import annotations

import torch

from chatpage.engine.kv_cache import KVCache
from chatpage.engine.models.llama import AttentionMetadata, LlamaModel
from chatpage.engine.scheduler import ScheduledSeq


class ModelRunner:
    def __init__(self, model: LlamaModel, kv: KVCache, tables: dict[int, list[int]],
                 block_size: int) -> None:
        self.model = model
        self.kv = kv
        self.tables = tables  # the block manager's tables, read-only here
        self.block_size = block_size

    @torch.inference_mode()
    def execute(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Run one step; logits [R, V] for the entries of ``batch`` whose ``samples`` is true."""
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
            ids += seq.token_ids[c : c + k]
            positions += range(c, c + k)
            starts.append(starts[-1] + k)
            lens.append(c + k)
            tables.append(self.tables[seq.seq_id])
            if c + k == len(seq):
                logit_rows.append(starts[-1] - 1)
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        pos = torch.tensor(positions, dtype=torch.int64)
        q_lens = torch.tensor([b - a for a, b in zip(starts, starts[1:], strict=False)])
        owner = torch.repeat_interleave(torch.arange(len(batch)), q_lens)
        slot_mapping = block_tables[owner, pos // bs].long() * bs + pos % bs
        meta = AttentionMetadata(
            slot_mapping=slot_mapping,
            block_tables=block_tables,
            seq_lens=torch.tensor(lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
        )
        device = self.model.device
        if device.type != "cpu":
            meta = AttentionMetadata(*(t.to(device, non_blocking=True) for t in vars(meta).values()))
            pos = pos.to(device)
        return self.model.forward(
            torch.tensor(ids, dtype=torch.int64, device=device), pos, meta,
            self.kv.k, self.kv.v, torch.tensor(logit_rows, dtype=torch.int64, device=device),
        )
