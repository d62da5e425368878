"""What the block manager keeps and is asked for: one record per sequence (`SeqBlocks`, its block
table in every KV group), read by the model runner as one group's tables (`GroupTables`), and the
scheduler's requests for room (`Demand`, starting from `ComputedBlocks`: its prefix-cache hits).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from chatpage.engine.core.sequence import Sequence


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """A sequence's prefix-cache hits (``BlockManager.get_computed_blocks``): the first
    ``num_tokens`` tokens are computed. ``blocks``: group 0's hit blocks, ``others``: those of
    groups 1, 2, ...; a sliding group's hold only the last blocks the window needs (its table
    starts with as many released entries as are missing). ``from_tier``: of ``num_tokens``,
    those read back from the disk tier for this lookup (the rest were on the device)."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0
    others: tuple[tuple[int, ...], ...] = ()
    from_tier: int = 0

    def hits(self, group: int) -> tuple[int, ...]:
        return self.blocks if group == 0 else self.others[group - 1]


@dataclass(frozen=True, slots=True)
class Demand:
    """Room for ``num_new_tokens`` more tokens of ``seq``. ``computed``: the prefix hits a
    sequence without blocks starts from; None for one that has its blocks."""

    seq: Sequence
    num_new_tokens: int
    computed: ComputedBlocks | None = None

    @property
    def num_computed_tokens(self) -> int:
        """Where the new tokens start."""
        return self.seq.num_computed_tokens if self.computed is None else self.computed.num_tokens


NULL_BLOCK = 0
"""What a released entry of a sliding group's table holds: a valid id the attention never reads
(every position in it is outside the window), so the table stays a plain tensor row."""


def group_key(group: int, block_hash: bytes) -> bytes:
    """The prefix-index key of group ``group``'s block for ``block_hash``: each group's layers
    keep their K/V in blocks of their own, so a hit is looked up per group."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


@dataclass(slots=True)
class SeqBlocks:
    """Everything the manager holds for one sequence, so that fork copies it and free drops it
    whole. ``tables[g]``: its block table in KV group ``g`` (``b >= 0``: device block ``b``;
    swapped out, ``cpu_entry(c)``: CPU block ``c``), whose first ``skipped[g]`` entries are
    released (``NULL_BLOCK``, no reference); ``registered``: how many leading blocks are in the
    prefix index; ``swapped``: out on the CPU. (Its blocks' chain hashes ride on the sequence,
    ``Sequence.block_hashes``, as vLLM keeps them on the request: a waiting prompt hashes once.)"""

    tables: list[list[int]]
    skipped: list[int]
    registered: int = 0
    swapped: bool = False

    def held(self, group: int) -> list[int]:
        """The entries of the table in ``group`` that reference a block."""
        return self.tables[group][self.skipped[group] :]

    def references(self) -> list[int]:
        """The entries that reference a block, in every group, each group's tail first (the
        order they are freed in, so that tails are evicted before heads)."""
        return [b for g in range(len(self.tables)) for b in reversed(self.held(g))]

    def copy(self) -> SeqBlocks:
        return SeqBlocks(
            [list(t) for t in self.tables], list(self.skipped), self.registered, self.swapped
        )


class GroupTables(Mapping[int, list[int]]):
    """KV group ``group``'s block table of each sequence with blocks, by sequence id: the
    records read as one group's tables (the model runner's view; it never writes them)."""

    def __init__(self, records: dict[int, SeqBlocks], group: int) -> None:
        self._records = records
        self._group = group

    def __getitem__(self, seq_id: int) -> list[int]:
        return self._records[seq_id].tables[self._group]

    def __iter__(self) -> Iterator[int]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)
