"""Per-sequence block tables over a device BlockPool and a CPU swap pool (BlockManager).

BlockManager maps each sequence's logical blocks to physical ones (chatpage/engine/core/block_pool.py):
allocation from one prefix-cache lookup, append, fork, copy-on-write, free, swap, pin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from chatpage.engine.core.block_pool import BlockPool, chain_hash, cpu_entry
from chatpage.engine.core.sequence import Sequence

__all__ = [
    "BlockCopies",
    "BlockManager",
    "BlockPool",
    "ComputedBlocks",
    "Demand",
    "NULL_BLOCK",
    "group_key",
    "chain_hash",
    "cpu_entry",
]


@dataclass(frozen=True, slots=True)
class ComputedBlocks:
    """A sequence's prefix-cache hits (``BlockManager.get_computed_blocks``): the first
    ``num_tokens`` tokens are computed. ``blocks``: group 0's hit blocks, ``others``: those of
    groups 1, 2, ...; a sliding group's hold only the last blocks the window needs (its table
    starts with as many released entries as are missing)."""

    blocks: tuple[int, ...] = ()
    num_tokens: int = 0
    others: tuple[tuple[int, ...], ...] = ()

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


BlockCopies = list[tuple[int, int]]
"""Block copies the KV cache makes before a forward pass, (source, destination) each."""


NULL_BLOCK = 0
"""What a released entry of a sliding group's table holds: a valid id the attention never reads
(every position in it is outside the window), so the table stays a plain tensor row."""


def group_key(group: int, block_hash: bytes) -> bytes:
    """The prefix-index key of group ``group``'s block for ``block_hash``: each group's layers
    keep their K/V in blocks of their own, so a hit is looked up per group."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


class BlockManager:
    """Block tables of every sequence over a device pool and a CPU swap pool.

    A table entry ``b >= 0`` is device block ``b``; a swapped-out sequence's table also holds
    CPU blocks, as ``cpu_entry(c)`` (negative). Blocks another holder still references stay on
    the device while a group is swapped out.

    ``windows``: one KV group per entry (``engine/core/kv_groups.py``), each with a table per
    sequence in ``group_tables`` (``tables`` is group 0's); 0 = full attention. A sliding
    group's blocks whose positions all left the window (of a query at the next position) are
    released as the sequence advances: its table's first ``skipped(group, seq)`` entries are
    ``NULL_BLOCK``, no reference. Every group allocates from the one pool.
    """

    def __init__(
        self,
        num_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        windows: tuple[int, ...] = (0,),
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.windows = windows
        self.pool = BlockPool(num_blocks)
        self.cpu_pool = BlockPool(num_cpu_blocks)
        self.group_tables: list[dict[int, list[int]]] = [{} for _ in windows]
        self.tables = self.group_tables[0]
        self._skipped: list[dict[int, int]] = [{} for _ in windows]  # released leading entries
        self._full_groups = [g for g, w in enumerate(windows) if not w]
        self._sliding_groups = [g for g, w in enumerate(windows) if w]
        self._hashes: dict[int, list[bytes]] = {}  # chain hashes of each sequence's full blocks
        self._registered: dict[int, int] = {}  # how many leading blocks are indexed
        self._swapped: set[int] = set()  # sequences swapped out (tables may hold CPU entries)
        self._pins: dict[Hashable, list[int]] = {}  # pin handle -> pinned blocks
        self.prefix_hit_tokens = 0

    def skipped(self, group: int, seq_id: int) -> int:
        """How many leading entries of the sequence's table in ``group`` are released."""
        return self._skipped[group].get(seq_id, 0)

    def held(self, group: int, seq_id: int) -> list[int]:
        """The entries of the sequence's table in ``group`` that reference a block."""
        return self.group_tables[group][seq_id][self.skipped(group, seq_id) :]

    def _window_start(self, group: int, num_tokens: int) -> int:
        """The first block a query at position ``num_tokens`` reads in ``group``."""
        w = self.windows[group]
        return max(0, (num_tokens - w + 1) // self.block_size) if w else 0

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

    def _lookup(self, group: int, block_hash: bytes) -> int | None:
        return self.pool.lookup(group_key(group, block_hash))

    def _full_hit(self, group: int, hashes: list[bytes], n: int) -> int:
        """How many leading blocks of ``hashes[:n]`` group ``group`` has cached."""
        for i in range(n):
            if self._lookup(group, hashes[i]) is None:
                return i
        return n

    def _sliding_hit(self, group: int, hashes: list[bytes], n: int) -> int:
        """The longest hit of at most ``n`` blocks that sliding group ``group`` can serve: the
        blocks in the window of its next query cached (vLLM's right-to-left scan)."""
        right = n  # the hit the current run of cached blocks would end
        if self._window_start(group, right * self.block_size) >= right:
            return right  # (a window of one token needs no earlier block)
        for i in range(n - 1, -1, -1):
            if self._lookup(group, hashes[i]) is None:
                right = i
            elif i <= self._window_start(group, right * self.block_size):
                return right
        return 0

    def get_computed_blocks(self, seq: Sequence) -> ComputedBlocks:
        """The cached blocks matching the leading full blocks of ``seq``, a sequence without
        blocks yet (never its last token: that one is computed for its logits), in every group:
        as long a prefix as each full-attention group has and each sliding group's window can
        be served for. Looked up once per admission; ``allocate_slots`` takes them from this
        result."""
        if not self.enable_caching:
            return ComputedBlocks(others=((),) * (len(self.windows) - 1))
        hashes = self._block_hashes(seq)
        n = min(len(hashes), (len(seq) - 1) // self.block_size)
        for g in self._full_groups:  # a full group's hit holds for any shorter prefix too
            n = self._full_hit(g, hashes, n)
        while self._sliding_groups:  # a sliding group's may not: settle on one that all serve
            m = n
            for g in self._sliding_groups:
                m = self._sliding_hit(g, hashes, m)
            if m == n:
                break
            n = m
        hits = []
        for g in range(len(self.windows)):
            lo = self._window_start(g, n * self.block_size)
            hits.append(tuple(self._lookup(g, hashes[i]) for i in range(lo, n)))
        return ComputedBlocks(hits[0], n * self.block_size, tuple(hits[1:]))  # type: ignore[arg-type]

    # -- allocation --------------------------------------------------------------------------------
    def _num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _shared_write(self, table: list[int], seq: Sequence) -> int | None:
        """Where in ``table`` (one of its groups') ``seq`` writes next, if another sequence
        shares that block (a copy-on-write is due)."""
        first = seq.num_computed_tokens // self.block_size
        return first if first < len(table) and self.pool.ref[table[first]] > 1 else None

    def _blocks_to_allocate(self, demand: Demand) -> int:
        """Blocks ``demand`` takes from the free count, in every group: new ones, a
        copy-on-write of the shared block it writes into, and prefix hits waiting in the LRU
        (they stop being available)."""
        total = self._num_blocks(demand.num_computed_tokens + demand.num_new_tokens)
        need = 0
        if demand.computed is not None:
            have = self._num_blocks(demand.computed.num_tokens)  # (hits are whole blocks)
            for g in range(len(self.windows)):
                hits = demand.computed.hits(g)
                need += total - have + sum(1 for b in hits if self.pool.is_evictable(b))
            return need
        for tables in self.group_tables:
            table = tables[demand.seq.seq_id]
            need += total - len(table) + (self._shared_write(table, demand.seq) is not None)
        return need

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
        n = computed.num_tokens // self.block_size
        for g, tables in enumerate(self.group_tables):
            hits = computed.hits(g)
            for b in hits:
                self.pool.incref(b)
            tables[seq.seq_id] = [NULL_BLOCK] * (n - len(hits)) + list(hits)
            if len(hits) < n:
                self._skipped[g][seq.seq_id] = n - len(hits)
        self._registered[seq.seq_id] = n
        seq.num_computed_tokens = computed.num_tokens
        self.prefix_hit_tokens += computed.num_tokens

    def _extend(self, seq: Sequence, num_new_tokens: int, copies: BlockCopies) -> None:
        """Blocks for ``num_new_tokens`` more tokens of ``seq`` in every group, each one it
        writes private (a copy-on-write goes to ``copies``)."""
        total = self._num_blocks(seq.num_computed_tokens + num_new_tokens)
        for tables in self.group_tables:
            table = tables[seq.seq_id]
            i = self._shared_write(table, seq)
            if i is not None:
                fresh = self.pool.allocate()
                copies.append((table[i], fresh))
                self.pool.decref(table[i])
                table[i] = fresh
            while len(table) < total:
                table.append(self.pool.allocate())

    def commit(self, seq: Sequence) -> None:
        """Index the blocks that became full of computed tokens (reuse across turns), then
        release the sliding groups' blocks that left their windows."""
        if self.enable_caching:
            self._register(seq)
        for g in self._sliding_groups:
            self._slide(g, seq)

    def _register(self, seq: Sequence) -> None:
        full = seq.num_computed_tokens // self.block_size
        done = self._registered[seq.seq_id]
        if full <= done:
            return
        hashes = self._block_hashes(seq)
        for g, tables in enumerate(self.group_tables):
            table = tables[seq.seq_id]
            for i in range(done, full):
                self.pool.register(table[i], group_key(g, hashes[i]))
        self._registered[seq.seq_id] = full

    def _slide(self, group: int, seq: Sequence) -> None:
        """Release the blocks of ``seq`` in sliding ``group`` that no later query reads (each
        stays cached for prefix hits while the pool does not need it)."""
        start = self._window_start(group, seq.num_computed_tokens)
        skipped = self._skipped[group]
        done = skipped.get(seq.seq_id, 0)
        if start <= done:
            return
        table = self.group_tables[group][seq.seq_id]
        for i in range(done, start):
            self.pool.decref(table[i])
            table[i] = NULL_BLOCK
        skipped[seq.seq_id] = start

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (ref counts up)."""
        for g, tables in enumerate(self.group_tables):
            for b in self.held(g, parent.seq_id):
                self._incref(b)
            tables[child.seq_id] = list(tables[parent.seq_id])
            if parent.seq_id in self._skipped[g]:
                self._skipped[g][child.seq_id] = self._skipped[g][parent.seq_id]
        self._hashes[child.seq_id] = list(self._hashes.get(parent.seq_id, ()))
        self._registered[child.seq_id] = self._registered[parent.seq_id]
        if parent.seq_id in self._swapped:
            self._swapped.add(child.seq_id)

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first (so tails are evicted before heads)."""
        self._hashes.pop(seq.seq_id, None)
        self._registered.pop(seq.seq_id, None)
        self._swapped.discard(seq.seq_id)
        for tables, skipped in zip(self.group_tables, self._skipped, strict=True):
            table = tables.pop(seq.seq_id, None)
            if table is None:
                return
            for b in reversed(table[skipped.pop(seq.seq_id, 0) :]):
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

    def peak_blocks(self, prompt_len: int, longest: int, width: int, chunk: int) -> int:
        """The most blocks a request of ``width`` sequences holds at once, growing from
        ``prompt_len`` to ``longest`` tokens in prefill chunks of at most ``chunk``: each
        full-attention group every block, the samples sharing the prompt's full ones; each
        sliding group a chunk and its window while it prefills, its window (and the block being
        written) per sequence after."""
        per_seq = self._num_blocks(longest)
        need = 0
        for w in self.windows:
            if not w:
                need += per_seq + (width - 1) * (per_seq - prompt_len // self.block_size)
                continue
            prefill = min(per_seq, self._num_blocks(w + chunk) + 1)
            need += max(prefill, width * min(per_seq, self._num_blocks(w) + 2))
        return need

    # -- swapping ----------------------------------------------------------------------------------
    def _group_refs(self, seqs: list[Sequence]) -> Counter[int]:
        """How often the group's tables name each entry (device ids and CPU entries)."""
        refs: Counter[int] = Counter()
        for g in range(len(self.windows)):
            for s in seqs:
                refs.update(self.held(g, s.seq_id))
        return refs

    def _leaving(self, seqs: list[Sequence]) -> Counter[int]:
        """Device blocks that only this group holds: the ones a swap-out moves."""
        return Counter(
            {b: n for b, n in self._group_refs(seqs).items() if b >= 0 and self.pool.ref[b] == n}
        )

    def _entry_hashes(self, seqs: list[Sequence]) -> dict[int, bytes]:
        """The prefix-index key of every indexed table entry of the group (full, committed
        blocks)."""
        hashes: dict[int, bytes] = {}
        for g, tables in enumerate(self.group_tables):
            for s in seqs:
                table, known = tables[s.seq_id], self._hashes.get(s.seq_id, [])
                end = min(self._registered.get(s.seq_id, 0), len(known))
                for i in range(self.skipped(g, s.seq_id), end):
                    hashes.setdefault(table[i], group_key(g, known[i]))
        return hashes

    def _returning(self, seqs: list[Sequence]) -> tuple[Counter[int], dict[int, int]]:
        """CPU entries of a swapped group, and those whose content is still indexed on the
        device (entry -> device block): they come back by reference, not by copy."""
        cpu = Counter({b: n for b, n in self._group_refs(seqs).items() if b < 0})
        cached: dict[int, int] = {}
        if self.enable_caching:
            for entry, key in self._entry_hashes(seqs).items():
                block = self.pool.lookup(key) if entry in cpu else None
                if block is not None:
                    cached[entry] = block
        return cpu, cached

    def _retable(self, seqs: list[Sequence], mapping: dict[int, int]) -> None:
        for g, tables in enumerate(self.group_tables):
            for s in seqs:
                table, start = tables[s.seq_id], self.skipped(g, s.seq_id)
                table[start:] = [mapping.get(b, b) for b in table[start:]]

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
        """Pin the sequence's full prompt blocks under ``handle`` (in a sliding group, those
        still held: the window a hit on the whole prompt needs); returns how many."""
        full = min(seq.prompt_len, seq.num_computed_tokens) // self.block_size
        blocks = [
            b
            for g, tables in enumerate(self.group_tables)
            for b in tables[seq.seq_id][self.skipped(g, seq.seq_id) : full]
        ]
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
        for g, tables in enumerate(self.group_tables):
            if set(tables) != set(self.tables):
                problems.append(f"group {g} has tables for other sequences than group 0")
            for sid in tables:
                for b in self.held(g, sid):
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
        """Table entries that reference a block, of sequences on the device, in every group."""
        return sum(
            len(t) - self.skipped(g, sid)
            for g, tables in enumerate(self.group_tables)
            for sid, t in tables.items()
            if sid not in self._swapped
        )
