"""Per-sequence block tables over a device BlockPool and a CPU swap pool (BlockManager).

BlockManager maps each sequence's logical blocks to physical ones (chatpage/engine/block_pool.py):
allocation from one prefix-cache lookup, append, fork, copy-on-write, free, swap, pin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from chatpage.engine.block_pool import BlockPool, chain_hash, cpu_entry
from chatpage.engine.sequence import Sequence

__all__ = [
    "BlockCopies",
    "BlockManager",
    "BlockPool",
    "ComputedBlocks",
    "Demand",
    "chain_hash",
    "cpu_entry",
]


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """A sequence's prefix-cache hits (``BlockManager.get_computed_blocks``)."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0


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


BlockCopies = list[tuple[int, int]]
"""Block copies the KV cache makes before a forward pass, (source, destination) each."""


class BlockManager:
    """Block tables of every sequence over a device pool and a CPU swap pool.

    A table entry ``b >= 0`` is device block ``b``; a swapped-out sequence's table also holds
    CPU blocks, as ``cpu_entry(c)`` (negative). Blocks another holder still references stay on
    the device while a group is swapped out.
    """

    def __init__(
        self, num_blocks: int, num_cpu_blocks: int, block_size: int, enable_caching: bool = True
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks)
        self.cpu_pool = BlockPool(num_cpu_blocks)
        self.tables: dict[int, list[int]] = {}
        self._hashes: dict[int, list[bytes]] = {}  # chain hashes of each sequence's full blocks
        self._registered: dict[int, int] = {}  # how many leading blocks are indexed
        self._swapped: set[int] = set()  # sequences swapped out (tables may hold CPU entries)
        self._pins: dict[Hashable, list[int]] = {}  # pin handle -> pinned blocks
        self.prefix_hit_tokens = 0

    # -- hashing ---------------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence) -> list[bytes]:
        hashes = self._hashes.setdefault(seq.seq_id, [])
        bs = self.block_size
        tokens = seq.token_ids
        parent = hashes[-1] if hashes else None
        for i in range(len(hashes), len(tokens) // bs):
            parent = chain_hash(parent, tuple(tokens[i * bs : (i + 1) * bs]))
            hashes.append(parent)
        return hashes

    def get_computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """The cached blocks matching the leading full blocks of ``seq``, a sequence without
        blocks yet (never its last token: that one is computed for its logits). Looked up once
        per admission; ``allocate_slots`` takes them from this result."""
        if not self.enable_caching:
            return ComputedBlocks()
        hits: list[int] = []
        max_blocks = (len(seq) - 1) // self.block_size
        for h in self._block_hashes(seq)[:max_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            hits.append(block)
        return ComputedBlocks(tuple(hits), len(hits) * self.block_size)

    # -- allocation --------------------------------------------------------------------------------
    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _shared_write(self, seq: Sequence) -> int | None:
        """Where in its table ``seq`` writes next, if another sequence shares that block (a
        copy-on-write is due)."""
        table = self.tables[seq.seq_id]
        first = seq.num_computed_tokens // self.block_size
        return first if first < len(table) and self.pool.ref[table[first]] > 1 else None

    def _blocks_to_allocate(self, demand: Demand) -> int:
        """Blocks ``demand`` takes from the free count: new ones, a copy-on-write of the shared
        block it writes into, and prefix hits waiting in the LRU (they stop being available)."""
        total = self._num_blocks(demand.num_computed_tokens + demand.num_new_tokens)
        if demand.computed is not None:
            hits = demand.computed.blocks
            return total - len(hits) + sum(1 for b in hits if self.pool.is_evictable(b))
        cow = self._shared_write(demand.seq) is not None
        return total - len(self.tables[demand.seq.seq_id]) + cow

    def allocate_slots(self, demands: list[Demand], reserve: int = 0) -> BlockCopies | None:
        """Make room for every demand, or for none: None, with nothing changed, when that would
        leave fewer than ``reserve`` blocks free. A sequence without blocks starts from its
        prefix hits (``Demand.computed``); a shared block it writes into is copied first: the
        copy-on-write pairs are returned.

        The room is counted per sequence as if each were alone: exact for one sequence, an upper
        bound for a group whose sequences share a block they all write into."""
        need = sum(self._blocks_to_allocate(d) for d in demands)
        if need + reserve > self.pool.num_free:
            return None
        # the hits first, so that allocating fresh blocks cannot evict one of them
        for d in demands:
            if d.computed is not None:
                self._take_hits(d.seq, d.computed)
        copies: BlockCopies = []
        for d in demands:
            self._extend(d.seq, d.num_new_tokens, copies)
        return copies

    def _take_hits(self, seq: Sequence, computed: ComputedBlocks) -> None:
        assert seq.seq_id not in self.tables, "prefix hits are for a sequence without blocks"
        for b in computed.blocks:
            self.pool.incref(b)
        self.tables[seq.seq_id] = list(computed.blocks)
        self._registered[seq.seq_id] = len(computed.blocks)
        seq.num_computed_tokens = computed.num_tokens
        self.prefix_hit_tokens += computed.num_tokens

    def _extend(self, seq: Sequence, num_new_tokens: int, copies: BlockCopies) -> None:
        """Blocks for ``num_new_tokens`` more tokens of ``seq``, each one it writes private
        (a copy-on-write goes to ``copies``)."""
        table = self.tables[seq.seq_id]
        i = self._shared_write(seq)
        if i is not None:
            fresh = self.pool.allocate()
            copies.append((table[i], fresh))
            self.pool.decref(table[i])
            table[i] = fresh
        total = self._num_blocks(seq.num_computed_tokens + num_new_tokens)
        while len(table) < total:
            table.append(self.pool.allocate())

    def commit(self, seq: Sequence) -> None:
        """Index the blocks that became full of computed tokens (reuse across turns)."""
        if not self.enable_caching:
            return
        full = seq.num_computed_tokens // self.block_size
        done = self._registered[seq.seq_id]
        if full <= done:
            return
        hashes = self._block_hashes(seq)
        table = self.tables[seq.seq_id]
        for i in range(done, full):
            self.pool.register(table[i], hashes[i])
        self._registered[seq.seq_id] = full

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (ref counts up)."""
        table = self.tables[parent.seq_id]
        for b in table:
            self._incref(b)
        self.tables[child.seq_id] = list(table)
        self._hashes[child.seq_id] = list(self._hashes.get(parent.seq_id, ()))
        self._registered[child.seq_id] = self._registered[parent.seq_id]
        if parent.seq_id in self._swapped:
            self._swapped.add(child.seq_id)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first (so tails are evicted before heads)."""
        table = self.tables.pop(seq.seq_id, None)
        self._hashes.pop(seq.seq_id, None)
        self._registered.pop(seq.seq_id, None)
        if table is None:
            return
        self._swapped.discard(seq.seq_id)
        for b in reversed(table):
            self._decref(b)

    def _incref(self, entry: int) -> None:
        if entry < 0:
            self.cpu_pool.incref(cpu_entry(entry))
        else:
            self.pool.incref(entry)

    def _decref(self, entry: int) -> None:
        if entry < 0:
            self.cpu_pool.decref(cpu_entry(entry))
        else:
            self.pool.decref(entry)

    def reset(self, seq: Sequence) -> None:
        """Drop the sequence's KV (preemption by recompute): free blocks, nothing computed."""
        self.free(seq)
        seq.num_computed_tokens = 0

    # -- swapping ----------------------------------------------------------------------------------
    def _group_refs(self, seqs: list[Sequence]) -> Counter[int]:
        """How often the group's tables name each entry (device ids and CPU entries)."""
        refs: Counter[int] = Counter()
        for s in seqs:
            refs.update(self.tables[s.seq_id])
        return refs

    def _leaving(self, seqs: list[Sequence]) -> Counter[int]:
        """Device blocks that only this group holds: the ones a swap-out moves."""
        return Counter(
            {b: n for b, n in self._group_refs(seqs).items() if b >= 0 and self.pool.ref[b] == n}
        )

    def _entry_hashes(self, seqs: list[Sequence]) -> dict[int, bytes]:
        """The chain hash of every indexed table entry of the group (full, committed blocks)."""
        hashes: dict[int, bytes] = {}
        for s in seqs:
            table, known = self.tables[s.seq_id], self._hashes.get(s.seq_id, [])
            for i in range(min(self._registered.get(s.seq_id, 0), len(known))):
                hashes.setdefault(table[i], known[i])
        return hashes

    def _returning(self, seqs: list[Sequence]) -> tuple[Counter[int], dict[int, int]]:
        """CPU entries of a swapped group, and those whose content is still indexed on the
        device (entry -> device block): they come back by reference, not by copy."""
        cpu = Counter({b: n for b, n in self._group_refs(seqs).items() if b < 0})
        cached: dict[int, int] = {}
        if self.enable_caching:
            for entry, h in self._entry_hashes(seqs).items():
                block = self.pool.lookup(h) if entry in cpu else None
                if block is not None:
                    cached[entry] = block
        return cpu, cached

    def _retable(self, seqs: list[Sequence], mapping: dict[int, int]) -> None:
        for s in seqs:
            table = self.tables[s.seq_id]
            table[:] = [mapping.get(b, b) for b in table]

    def swap_out(self, seqs: list[Sequence]) -> BlockCopies | None:
        """Move the blocks only this group holds to the CPU pool (each once, however many of
        its sequences share it); blocks also held elsewhere stay on the device. Returns the
        (device, cpu) copies, or None, with nothing changed, when the CPU pool lacks room."""
        leaving = self._leaving(seqs)
        if len(leaving) > self.cpu_pool.num_free:
            return None
        pairs: BlockCopies = []
        mapping: dict[int, int] = {}
        for b, n in leaving.items():
            c = self.cpu_pool.allocate()
            for _ in range(n - 1):
                self.cpu_pool.incref(c)
            for _ in range(n):
                self.pool.decref(b)
            pairs.append((b, c))
            mapping[b] = cpu_entry(c)
        self._retable(seqs, mapping)
        self._swapped.update(s.seq_id for s in seqs)
        return pairs

    def swap_in(self, seqs: list[Sequence], reserve: int = 0) -> BlockCopies | None:
        """Bring a swapped group back: blocks still indexed on the device are shared again,
        the rest are copied into fresh blocks (and indexed again). Returns the (cpu, device)
        copies, or None, with nothing changed, when that would leave fewer than ``reserve``
        device blocks free (cached blocks it revives count)."""
        cpu, cached = self._returning(seqs)
        revived = {b for b in cached.values() if self.pool.is_evictable(b)}
        need = sum(1 for e in cpu if e not in cached) + len(revived)
        if need + reserve > self.pool.num_free:
            return None
        pairs: BlockCopies = []
        hashes = self._entry_hashes(seqs) if self.enable_caching else {}
        mapping: dict[int, int] = {}
        # take the cached blocks first, so that allocating the others cannot evict them
        for entry, n in sorted(cpu.items(), key=lambda item: item[0] not in cached):
            c = cpu_entry(entry)
            block = cached.get(entry)
            if block is None:
                block = self.pool.allocate()
                pairs.append((c, block))
                if entry in hashes:
                    self.pool.register(block, hashes[entry])
                n -= 1
            for _ in range(n):
                self.pool.incref(block)
            for _ in range(cpu[entry]):
                self.cpu_pool.decref(c)
            mapping[entry] = block
        self._retable(seqs, mapping)
        self._swapped.difference_update(s.seq_id for s in seqs)
        return pairs

    # -- pins --------------------------------------------------------------------------------------
    def pin(self, seq: Sequence, handle: Hashable) -> int:
        """Pin the sequence's full prompt blocks under ``handle``; returns how many."""
        full = min(seq.prompt_len, seq.num_computed_tokens) // self.block_size
        blocks = self.tables[seq.seq_id][:full]
        for b in blocks:
            self.pool.pin(b)
        self._pins[handle] = blocks
        return len(blocks)

    def unpin(self, handle: Hashable) -> None:
        for b in self._pins.pop(handle, []):
            self.pool.unpin(b)

    def audit(self) -> list[str]:
        """Inconsistencies, if any: every block's ref count must equal the table entries and
        pins naming it, in the pool the entry names (a soak test checks this every step)."""
        problems: list[str] = []
        dev: Counter[int] = Counter()
        cpu: Counter[int] = Counter()
        for table in self.tables.values():
            for b in table:
                if b < 0:
                    cpu[cpu_entry(b)] += 1
                else:
                    dev[b] += 1
        for blocks in self._pins.values():
            dev.update(blocks)
        for name, pool, refs in (("device", self.pool, dev), ("cpu", self.cpu_pool, cpu)):
            wrong = [b for b in range(pool.num_blocks) if pool.ref[b] != refs[b]]
            problems += [
                f"{name} block {b}: ref {pool.ref[b]} but {refs[b]} references" for b in wrong
            ]
            if pool.num_used != sum(r > 0 for r in pool.ref):
                problems.append(f"{name} pool counts {pool.num_used} used blocks")
            if pool.num_free + pool.num_used != pool.num_blocks:
                problems.append(f"{name} pool: free + used != {pool.num_blocks}")
        return problems

    @property
    def num_private_blocks(self) -> int:
        """Device blocks held by exactly one sequence and no pin."""
        pinned = {b for blocks in self._pins.values() for b in blocks}
        shared_pinned = sum(1 for b in pinned if self.pool.ref[b] > 1)
        pool = self.pool
        return pool.num_used - pool.num_pinned - (pool.num_shared - shared_pinned)

    @property
    def num_logical_blocks(self) -> int:
        return sum(len(t) for sid, t in self.tables.items() if sid not in self._swapped)
