"""The KV cache tensors: the device block pool and the CPU swap pool, per layer.

On a GPU the swap pool is pinned host memory and swaps run on a side stream: they start after
the work already queued on the step's stream (which last wrote those blocks), and the step's
stream waits for them before the next forward reads or overwrites the blocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from chatpage.engine.model import attention


def row_size(head_dim: int, dtype: torch.dtype) -> int:
    """The elements of one token's one KV head in a cache of ``dtype``: ``head_dim``, and an int8
    cache's scale after them (``attention.INT8_SCALE_BYTES``)."""
    return head_dim + (attention.INT8_SCALE_BYTES if dtype == torch.int8 else 0)


def bytes_per_block(
    num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """K and V of one block across ``num_layers`` layers (a KV group's page)."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * row_size(head_dim, dtype) * elem


@dataclass(frozen=True)
class KVFormat:
    """What a block's KV bytes are: blocks of one format mean the same tokens the same way, of
    two formats never (a prefix namespace includes it). ``dtype``: the cache's torch dtype name
    ("int8": rows of ``head_dim`` int8 values and an fp16 scale, ``attention.INT8_SCALE_BYTES``);
    ``layers``: the pools a block spans."""

    dtype: str
    block_size: int
    layers: int
    num_kv_heads: int
    head_dim: int
    layout: int = 1  # bumped when a dtype's bytes change meaning

    def describe(self) -> str:
        """One line of every field, for a digest."""
        return (
            f"kv {self.dtype} layout {self.layout} block {self.block_size} layers {self.layers} "
            f"heads {self.num_kv_heads} dim {self.head_dim}"
        )


class KVCache:
    """Per-layer K/V pools ``[num_blocks, block_size, num_kv_heads, head_dim]`` plus swap space
    (an int8 pool's rows hold their scale too: ``row_size``).

    ``layer_slot[l]``: the pool layer ``l`` keeps its K/V in (``engine/core/kv_groups.py``): a block is
    one page of as many layers as there are slots, in whichever KV group holds it; layers of
    different groups share a slot's pool (each reads it through its own group's table). None: a
    pool per layer."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: str,
        layer_slot: tuple[int, ...] | None = None,
    ) -> None:
        slots = range(num_layers) if layer_slot is None else layer_slot
        num_slots = max(slots) + 1
        row = row_size(head_dim, dtype)
        shape = (num_blocks, block_size, num_kv_heads, row)
        cpu_shape = (num_cpu_blocks, block_size, num_kv_heads, row)
        self.format = KVFormat(
            str(dtype).removeprefix("torch."), block_size, num_slots, num_kv_heads, head_dim
        )
        # zeros: padded reads of never-written slots must stay finite (masked out, times zero)
        self.slot_k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_slots)]
        self.slot_v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_slots)]
        self.k = [self.slot_k[s] for s in slots]  # per layer
        self.v = [self.slot_v[s] for s in slots]
        cuda = torch.device(device).type == "cuda"
        self.cpu_k = [
            torch.empty(cpu_shape, dtype=dtype, pin_memory=cuda) for _ in range(num_slots)
        ]
        self.cpu_v = [
            torch.empty(cpu_shape, dtype=dtype, pin_memory=cuda) for _ in range(num_slots)
        ]
        self._side = torch.cuda.Stream(torch.device(device)) if cuda else None

    def block_tensors(self) -> list[torch.Tensor]:
        """Every device tensor that holds a block's KV, the block index its dim 0 (what
        copy-on-write and swaps carry)."""
        return self.slot_k + self.slot_v

    def cpu_block_tensors(self) -> list[torch.Tensor]:
        """The swap pool's tensors, in ``block_tensors``' order."""
        return self.cpu_k + self.cpu_v

    @staticmethod
    def _pairs(pairs: list[tuple[int, int]]) -> torch.Tensor:
        return torch.tensor(pairs, dtype=torch.int64).view(-1, 2)

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write: block dst becomes a copy of block src in every layer."""
        if pairs:
            attention.copy_blocks(self.block_tensors(), self._pairs(pairs))

    def _on_side_stream(self, copies: Callable[[], None]) -> None:
        """Run ``copies`` on the swap stream (a GPU pool), ordered after and before the step's
        stream; on the CPU, right here."""
        if self._side is None:
            copies()
            return
        step = torch.cuda.current_stream(self._side.device)
        self._side.wait_stream(step)
        with torch.cuda.stream(self._side):
            copies()
        step.wait_stream(self._side)

    def _swap(
        self, sources: list[torch.Tensor], targets: list[torch.Tensor], pairs: list[tuple[int, int]]
    ) -> None:
        if pairs:
            m = self._pairs(pairs)

            def copies() -> None:
                for src, dst in zip(sources, targets, strict=True):
                    attention.swap_blocks(src, dst, m)

            self._on_side_stream(copies)

    def swap_out(self, pairs: list[tuple[int, int]]) -> None:
        """Device block src -> CPU block dst, in every layer."""
        self._swap(self.block_tensors(), self.cpu_block_tensors(), pairs)

    def swap_in(self, pairs: list[tuple[int, int]]) -> None:
        """CPU block src -> device block dst, in every layer."""
        self._swap(self.cpu_block_tensors(), self.block_tensors(), pairs)
