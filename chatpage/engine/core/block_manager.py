"""Per-sequence block tables over a device BlockPool and a CPU swap pool (BlockManager).

BlockManager maps each sequence's logical blocks to physical ones (chatpage/engine/core/block_pool.py):
allocation from one prefix-cache lookup, append, fork, copy-on-write, free, swap, pin. It keeps
one record per sequence (`SeqBlocks`, ``engine/core/block_table.py``) and asks each KV group's
policy (``engine/core/kv_policy.py``: full attention, sliding window) what differs by attention
type. With a disk tier (``engine/core/kv_tiers.py``) it is the next level down: every indexed
block a sequence lets go of (freed, or slid out of its window) is saved there unless it already
is, and a prompt's lookup reads the blocks the device lacks back from it into free blocks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from chatpage.engine.core.block_pool import BlockPool, cpu_entry, extend_hashes
from chatpage.engine.core.block_table import (
    NULL_BLOCK,
    ComputedBlocks,
    Demand,
    GroupTables,
    SeqBlocks,
    group_key,
)
from chatpage.engine.core.kv_policy import kv_policy, longest_common_hit, num_blocks
from chatpage.engine.core.kv_tiers import DiskTier
from chatpage.engine.core.sequence import Sequence
from chatpage.engine.core.step import BlockCopies, BlockLoads


class BlockManager:
    """Block tables of every sequence over a device pool and a CPU swap pool.

    A table entry ``b >= 0`` is device block ``b``; a swapped-out sequence's table also holds
    CPU blocks, as ``cpu_entry(c)`` (negative). Blocks another holder still references stay on
    the device while a group is swapped out.

    ``windows``: one KV group per entry (``engine/core/kv_groups.py``), 0 = full attention,
    each with its `KVPolicy` and a table per sequence (read as ``group_tables``; ``tables`` is
    group 0's). A sliding group's blocks whose positions all left the window (of a query at the
    next position) are released as the sequence advances. Every group allocates from the one
    pool.
    """

    def __init__(
        self,
        num_blocks: int,
        num_cpu_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        windows: tuple[int, ...] = (0,),
        tier: DiskTier | None = None,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.windows = windows
        self.policies = [kv_policy(block_size, w) for w in windows]
        self.tier = tier if enable_caching else None
        self.pool = BlockPool(num_blocks, self.tier)  # (the tier reads queued blocks in place)
        self.cpu_pool = BlockPool(num_cpu_blocks)
        self._records: dict[int, SeqBlocks] = {}  # by sequence id: the sequences with blocks
        self.group_tables = [GroupTables(self._records, g) for g in range(len(windows))]
        self.tables = self.group_tables[0]
        self._pins: dict[Hashable, list[int]] = {}  # pin handle -> pinned blocks
        self.prefix_hit_tokens = 0
        self.tier_hit_tokens = 0  # of prefix_hit_tokens, read from the tier (group 0's blocks)
        # hits handed out by lookups whose allocation has not run yet: reading other blocks up
        # from the tier must not evict them
        self._handed_out: list[int] = []
        self._loads: BlockLoads = []  # read from the tier, to write into the pool (`take_loads`)
        self._ahead: dict[int, list[bytes]] = {}  # by sequence id: its blocks read ahead

    def holds(self, seq: Sequence) -> bool:
        """Whether ``seq`` has blocks (on the device or swapped out)."""
        return seq.seq_id in self._records

    def record(self, seq_id: int) -> SeqBlocks:
        """What the manager holds for sequence ``seq_id`` (read-only outside)."""
        return self._records[seq_id]

    # -- prefix cache ------------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence) -> list[bytes]:
        return extend_hashes(seq.block_hashes, seq.token_ids, self.block_size)

    def _lookup(self, group: int, block_hash: bytes) -> int | None:
        return self.pool.lookup(group_key(group, block_hash))

    def get_computed_blocks(self, seq: Sequence, whole: bool = False) -> ComputedBlocks:
        """The cached blocks matching the leading full blocks of ``seq``, a sequence without
        blocks yet (never its last token: that one is computed for its logits; ``whole``: every
        full block, for a pin, which needs none), in every group: as long a prefix as each
        full-attention group has and each sliding group's window can be served for. Looked up
        once per admission; ``allocate_slots`` takes them from this result."""
        if not self.enable_caching:
            return ComputedBlocks(others=((),) * (len(self.policies) - 1))
        hashes = self._block_hashes(seq)
        limit = len(hashes) if whole else min(len(hashes), (len(seq) - 1) // self.block_size)
        on_device = None
        if self.tier is not None:
            on_device = self._bring_up(seq, hashes, limit)
            self.tier.forget(self._ahead.pop(seq.seq_id, []))  # (what it did not take)
        n = longest_common_hit(
            self.policies, lambda g, i: self._lookup(g, hashes[i]) is not None, limit
        )
        hits = []
        for g, policy in enumerate(self.policies):
            lo = policy.window_start(n * self.block_size)
            hits.append(tuple(self._lookup(g, hashes[i]) for i in range(lo, n)))
        from_tier = 0 if on_device is None else max(0, n - on_device) * self.block_size
        self._handed_out += [b for group in hits for b in group if b is not None]
        return ComputedBlocks(hits[0], n * self.block_size, tuple(hits[1:]), from_tier)  # type: ignore[arg-type]

    def read_ahead(self, seq: Sequence) -> None:
        """Start reading the blocks of ``seq``'s prompt (a sequence without blocks) that the
        device lacks and the tier holds, on the tier's thread, so that the step admitting it
        finds them in memory (`reading_ahead`)."""
        tier = self.tier
        if tier is None or not tier.read_ahead:
            return
        hashes = self._block_hashes(seq)
        limit = min(len(hashes), (len(seq) - 1) // self.block_size)
        bs = self.block_size
        blocks = []
        for g, policy in enumerate(self.policies):
            for i in range(policy.window_start(limit * bs), limit):
                key = group_key(g, hashes[i])
                if self.pool.lookup(key) is not None:
                    continue
                if not tier.has(key):
                    break
                blocks.append((key, tuple(seq.token_ids[i * bs : (i + 1) * bs])))
        tier.prefetch(blocks)
        self._ahead[seq.seq_id] = [key for key, _ in blocks]

    def reading_ahead(self, seq: Sequence) -> bool:
        """Whether blocks of ``seq`` are still being read ahead."""
        keys = self._ahead.get(seq.seq_id)
        return keys is not None and self.tier is not None and not self.tier.arrived(keys)

    def take_loads(self) -> BlockLoads:
        """The blocks read from the tier since the last call, for the KV cache to write into
        the pool before the next forward pass (after the step's swap-outs: a block a swap-out
        left may be one of them)."""
        loads, self._loads = self._loads, []
        return loads

    def _bring_up(self, seq: Sequence, hashes: list[bytes], limit: int) -> int | None:
        """Read the blocks of ``seq``'s longest hit (of at most ``limit`` blocks) that only the
        tier holds, each given a free device block, indexed and left cached (ref 0) for the
        lookup to find, its bytes to be written there (`take_loads`); none when the pool lacks
        room for all of them. Returns how many of
        the hit's blocks in group 0 were on the device already (the rest of the hit is the
        tier's), or None when nothing was read."""
        tier = self.tier
        assert tier is not None
        keys = [[group_key(g, h) for h in hashes[:limit]] for g in range(len(self.policies))]
        n = longest_common_hit(
            self.policies,
            lambda g, i: self.pool.lookup(keys[g][i]) is not None or tier.has(keys[g][i]),
            limit,
        )
        # (position, device block), held while reading: the hit's blocks on the device, and
        # those earlier lookups handed out (position -1: released last, evicted last)
        held = [(-1, b) for b in self._handed_out if self.pool.is_evictable(b)]
        for _, b in held:
            self.pool.incref(b)
        missing: list[tuple[int, int]] = []  # (group, position)
        on_device = 0  # group 0's blocks of the hit that the device has
        for g, policy in enumerate(self.policies):
            for i in range(policy.window_start(n * self.block_size), n):
                block = self.pool.lookup(keys[g][i])
                if block is None:
                    missing.append((g, i))
                else:
                    self.pool.incref(block)  # (so that reading the others cannot evict it)
                    held.append((i, block))
                    on_device += g == 0
        loaded = False
        if len(missing) <= self.pool.num_free:
            bs = self.block_size
            for g, i in missing:
                payload = tier.read(keys[g][i], tuple(seq.token_ids[i * bs : (i + 1) * bs]))
                if payload is None:
                    continue
                block = self.pool.allocate()
                self.pool.register(block, keys[g][i])
                self._loads.append((block, payload))
                loaded = True
                held.append((i, block))
        # tails first, as `free` does: the cache evicts them before the heads
        for _, block in sorted(held, key=lambda h: -h[0]):
            self.pool.decref(block)
        return on_device if loaded else None

    # -- allocation --------------------------------------------------------------------------------
    def _shared_write(self, table: list[int], seq: Sequence) -> int | None:
        """Where in ``table`` (one of its groups') ``seq`` writes next, if another sequence
        shares that block (a copy-on-write is due)."""
        first = seq.num_computed_tokens // self.block_size
        return first if first < len(table) and self.pool.ref[table[first]] > 1 else None

    def _blocks_to_allocate(self, demand: Demand) -> int:
        """Blocks ``demand`` takes from the free count, in every group: new ones, a
        copy-on-write of the shared block it writes into, and prefix hits waiting in the LRU
        (they stop being available)."""
        total = num_blocks(demand.num_computed_tokens + demand.num_new_tokens, self.block_size)
        need = 0
        if demand.computed is not None:
            have = demand.computed.num_tokens // self.block_size  # (hits are whole blocks)
            for g in range(len(self.policies)):
                hits = demand.computed.hits(g)
                need += total - have + sum(1 for b in hits if self.pool.is_evictable(b))
            return need
        for table in self._records[demand.seq.seq_id].tables:
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
            self._handed_out.clear()  # (looked up again when they are tried again)
            return None
        # the hits first, so that allocating fresh blocks cannot evict one of them
        for d in demands:
            if d.computed is not None:
                self._take_hits(d.seq, d.computed)
        copies: BlockCopies = []
        for d in demands:
            self._extend(d.seq, d.num_new_tokens, copies)
        self._handed_out.clear()
        return copies

    def _take_hits(self, seq: Sequence, computed: ComputedBlocks) -> None:
        assert seq.seq_id not in self._records, "prefix hits are for a sequence without blocks"
        n = computed.num_tokens // self.block_size
        record = SeqBlocks([], [], registered=n)
        for g in range(len(self.policies)):
            hits = computed.hits(g)
            for b in hits:
                self.pool.incref(b)
            record.tables.append([NULL_BLOCK] * (n - len(hits)) + list(hits))
            record.skipped.append(n - len(hits))
        self._records[seq.seq_id] = record
        seq.num_computed_tokens = computed.num_tokens
        self.prefix_hit_tokens += computed.num_tokens
        self.tier_hit_tokens += computed.from_tier

    def _extend(self, seq: Sequence, num_new_tokens: int, copies: BlockCopies) -> None:
        """Blocks for ``num_new_tokens`` more tokens of ``seq`` in every group, each one it
        writes private (a copy-on-write goes to ``copies``)."""
        total = num_blocks(seq.num_computed_tokens + num_new_tokens, self.block_size)
        for table in self._records[seq.seq_id].tables:
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
        record = self._records[seq.seq_id]
        for g, policy in enumerate(self.policies):
            self._slide(seq, record, g, policy.window_start(seq.num_computed_tokens))

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past the ones ``seq``'s tokens occupy (a speculative step's
        rejected rows': fresh blocks, never indexed)."""
        keep = num_blocks(len(seq), self.block_size)
        for table in self._records[seq.seq_id].tables:
            while len(table) > keep:
                self.pool.decref(table.pop())

    def _register(self, seq: Sequence) -> None:
        record = self._records[seq.seq_id]
        full = seq.num_computed_tokens // self.block_size
        if full <= record.registered:
            return
        hashes = self._block_hashes(seq)
        for g, table in enumerate(record.tables):
            for i in range(record.registered, full):
                self.pool.register(table[i], group_key(g, hashes[i]))
        record.registered = full

    def _slide(self, seq: Sequence, record: SeqBlocks, group: int, start: int) -> None:
        """Release the blocks before ``start`` of ``seq``'s table in ``group``, which no
        later query reads (only a sliding window has any: each stays cached for prefix hits
        while the pool does not need it, and goes down to the tier)."""
        if start <= record.skipped[group]:
            return
        table = record.tables[group]
        self._save(seq, record, group, record.skipped[group], start)
        for i in range(record.skipped[group], start):
            self.pool.decref(table[i])
            table[i] = NULL_BLOCK
        record.skipped[group] = start

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """``child`` shares every block of ``parent`` (ref counts up)."""
        record = self._records[parent.seq_id]
        for entry in record.references():
            pool, block = self._pool_of(entry)
            pool.incref(block)
        self._records[child.seq_id] = record.copy()

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks, tail first (so tails are evicted before heads); its
        indexed ones go down to the tier first."""
        if self.tier is not None:
            self.tier.forget(self._ahead.pop(seq.seq_id, []))
        record = self._records.pop(seq.seq_id, None)
        if record is None:
            return
        for g in range(len(self.policies)):
            self._save(seq, record, g, record.skipped[g], len(record.tables[g]))
        for entry in record.references():
            pool, block = self._pool_of(entry)
            pool.decref(block)

    def _save(self, seq: Sequence, record: SeqBlocks, group: int, start: int, end: int) -> None:
        """Queue the indexed device blocks ``start:end`` of ``seq``'s table in ``group`` for the
        tier, those it does not hold yet (none without a tier)."""
        if self.tier is None:
            return
        table, bs = record.tables[group], self.block_size
        blocks = []
        for i in range(start, min(end, record.registered, len(seq.block_hashes))):
            key = group_key(group, seq.block_hashes[i])
            # (the block the pool indexes under the key: the tier reads it in place, and the
            # pool claims it back before overwriting it; a duplicate is never indexed)
            block = self.pool.lookup(key) if table[i] >= 0 else None
            if block is not None and not self.tier.has(key):
                blocks.append((block, key, tuple(seq.token_ids[i * bs : (i + 1) * bs])))
        self.tier.save(blocks)

    def _pool_of(self, entry: int) -> tuple[BlockPool, int]:
        """The pool and the block a table entry names."""
        return (self.cpu_pool, cpu_entry(entry)) if entry < 0 else (self.pool, entry)

    def reset(self, seq: Sequence) -> None:
        """Drop the sequence's KV (preemption by recompute): free blocks, nothing computed."""
        self.free(seq)
        seq.num_computed_tokens = 0

    def peak_blocks(self, prompt_len: int, longest: int, width: int, chunk: int) -> int:
        """The most blocks a request of ``width`` sequences holds at once, growing from
        ``prompt_len`` to ``longest`` tokens in prefill chunks of at most ``chunk``: each
        group's policy says (`KVPolicy.peak_blocks`)."""
        return sum(p.peak_blocks(prompt_len, longest, width, chunk) for p in self.policies)

    # -- swapping ----------------------------------------------------------------------------------
    def _group_refs(self, seqs: list[Sequence]) -> Counter[int]:
        """How often the group's tables name each entry (device ids and CPU entries)."""
        return Counter(b for s in seqs for b in self._records[s.seq_id].references())

    def _leaving(self, seqs: list[Sequence]) -> Counter[int]:
        """Device blocks that only this group holds: the ones a swap-out moves."""
        return Counter(
            {b: n for b, n in self._group_refs(seqs).items() if b >= 0 and self.pool.ref[b] == n}
        )

    def _entry_hashes(self, seqs: list[Sequence]) -> dict[int, bytes]:
        """The prefix-index key of every indexed table entry of the group (full, committed
        blocks)."""
        hashes: dict[int, bytes] = {}
        for g in range(len(self.policies)):
            for s in seqs:
                record, known = self._records[s.seq_id], s.block_hashes
                table, end = record.tables[g], min(record.registered, len(known))
                for i in range(record.skipped[g], end):
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

    def _retable(self, seqs: list[Sequence], mapping: dict[int, int], swapped: bool) -> None:
        """Rename the held entries of ``seqs`` by ``mapping``, which leaves them ``swapped``
        out or not."""
        for s in seqs:
            record = self._records[s.seq_id]
            for table, start in zip(record.tables, record.skipped, strict=True):
                table[start:] = [mapping.get(b, b) for b in table[start:]]
            record.swapped = swapped

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
        self._retable(seqs, mapping, swapped=True)
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
        self._retable(seqs, mapping, swapped=False)
        return pairs

    # -- pins --------------------------------------------------------------------------------------
    def pin(self, seq: Sequence, handle: Hashable) -> int:
        """Pin the sequence's full prompt blocks under ``handle`` (in a sliding group, those
        still held: the window a hit on the whole prompt needs); returns how many."""
        full = min(seq.prompt_len, seq.num_computed_tokens) // self.block_size
        record = self._records[seq.seq_id]
        blocks = [
            b for t, start in zip(record.tables, record.skipped, strict=True) for b in t[start:full]
        ]
        for b in blocks:
            self.pool.pin(b)
        self._pins[handle] = blocks
        return len(blocks)

    def pin_hits(self, seq: Sequence, computed: ComputedBlocks, handle: Hashable) -> bool:
        """Pin ``seq``'s prompt under ``handle`` from its prefix hits alone (``computed``, its
        `get_computed_blocks` with ``whole``: on the device, or read from the tier), without
        computing it: only when they hold every full block of it, as `pin` would pin. Returns
        whether it did; ``seq`` holds no blocks either way."""
        whole = len(seq) // self.block_size * self.block_size
        if not computed.num_tokens or computed.num_tokens < whole:
            return False
        blocks = [b for g in range(len(self.policies)) for b in computed.hits(g)]
        for b in blocks:
            self.pool.pin(b)
        self._pins[handle] = blocks
        self._handed_out.clear()
        self.prefix_hit_tokens += computed.num_tokens
        self.tier_hit_tokens += computed.from_tier
        return True

    def unpin(self, handle: Hashable) -> None:
        for b in self._pins.pop(handle, []):
            self.pool.unpin(b)

    def audit(self) -> list[str]:
        """Inconsistencies, if any: every block's ref count must equal the table entries and
        pins naming it, in the pool the entry names (a soak test checks this every step)."""
        problems: list[str] = []
        dev: Counter[int] = Counter()
        cpu: Counter[int] = Counter()
        for sid, record in self._records.items():
            if len(record.tables) != len(self.policies):
                problems.append(f"sequence {sid} has tables for {len(record.tables)} groups")
            for b in record.references():
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
        if self.tier is None:
            return problems
        for b, key in self.tier.in_place().items():
            if self.pool.block_hash[b] != key:
                problems.append(f"device block {b} is being written to disk but not indexed")
        return problems + self.tier.audit()

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
        return sum(len(r.references()) for r in self._records.values() if not r.swapped)
