"""BlockManager and BlockPool: a stateful model of the engine's use, plus focused unit tests.

The state machine drives a small BlockManager the way the scheduler and the engine do (capacity
block copies collected over a step and applied before its forward pass, as SchedulerOutput
carries them) and simulates the KV
data: every slot holds the token prefix whose K/V it stores, so a computed position reads back
its own context through its block table only if prefix reuse, copy-on-write and swapping are
right.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.block_pool import BlockPool, chain_hash, cpu_entry
from chatpage.engine.core.block_table import ComputedBlocks, Demand
from chatpage.engine.core.kv_tiers import DiskTier
from chatpage.engine.core.sequence import Sequence
from chatpage.engine.core.step import BlockCopies

BS = 4
NUM_BLOCKS = 12
NUM_CPU_BLOCKS = 10
MAX_LEN = 24  # tokens per sequence: at most 6 blocks, half the device pool
MAX_SEQS = 8


class _Detok:
    """A stand-in detokenizer: Sequence.fork only needs copy()."""

    def copy(self) -> _Detok:
        return self


def make_seq(tokens: list[int], prompt_len: int | None = None) -> Sequence:
    return Sequence(list(tokens), len(tokens) if prompt_len is None else prompt_len, _Detok())


def demand(bm: BlockManager, seq: Sequence, k: int | None = None) -> Demand:
    """What the scheduler asks for ``seq``: its prefix hits looked up once if it has no blocks,
    then ``k`` new tokens (default: the rest of it)."""
    computed = None if seq.seq_id in bm.tables else bm.get_computed_blocks(seq)
    d = Demand(seq, 0, computed)
    return replace(d, num_new_tokens=len(seq) - d.num_computed_tokens if k is None else k)


def step(bm: BlockManager, seq: Sequence, k: int | None = None) -> tuple[Demand, BlockCopies]:
    """One engine step for ``seq`` alone: allocate, run the model (nothing to simulate), commit;
    returns what it asked for and the copy-on-write pairs."""
    d = demand(bm, seq, k)
    copies = bm.allocate_slots([d])
    assert copies is not None
    seq.num_computed_tokens += d.num_new_tokens
    bm.commit(seq)
    return d, copies


def compute(bm: BlockManager, seq: Sequence, k: int | None = None) -> int:
    """:func:`step`; returns the prefix-hit tokens it started from."""
    d, _ = step(bm, seq, k)
    return 0 if d.computed is None else d.computed.num_tokens


def chain_of(tokens: tuple[int, ...]) -> int | None:
    """The chain hash of the last full block of ``tokens``."""
    h = None
    for i in range(len(tokens) // BS):
        h = chain_hash(h, tuple(tokens[i * BS : (i + 1) * BS]))
    return h


# -------------------------------------------------------------------------------------------------
# stateful model
# -------------------------------------------------------------------------------------------------


@dataclass
class Family:
    """Sequences that share blocks through fork: one request group. ``state`` is where its
    blocks are: 'waiting' (none: new or preempted by recompute), 'running' (device), 'swapped'."""

    seqs: list[Sequence]
    state: str = "waiting"


@dataclass
class Plan:
    """The block copies of one step, as SchedulerOutput carries them."""

    swap_out: BlockCopies = field(default_factory=list)
    tier_loads: list[tuple[int, list]] = field(default_factory=list)  # (block, its slots)
    swap_in: BlockCopies = field(default_factory=list)
    copies: BlockCopies = field(default_factory=list)


@dataclass
class Memory:
    """Simulated K/V contents: block id -> one entry per slot (the prefix it encodes, or None)."""

    dev: dict[int, list] = field(default_factory=dict)
    cpu: dict[int, list] = field(default_factory=dict)

    @staticmethod
    def _gather_scatter(
        src: dict[int, list], dst: dict[int, list], pairs: list[tuple[int, int]]
    ) -> None:
        # like the kernels (index_select then index_copy_): all sources are read before any write
        data = [list(src.get(s, [None] * BS)) for s, _ in pairs]
        for (_, d), block in zip(pairs, data, strict=True):
            dst[d] = block

    def apply(self, plan: Plan) -> None:
        """What LLMEngine.step does with the plan before the forward pass, in its order."""
        assert len({d for _, d in plan.copies}) == len(plan.copies), "a block copied into twice"
        self._gather_scatter(self.dev, self.cpu, plan.swap_out)
        for block, slots in plan.tier_loads:
            self.dev[block] = list(slots)
        self._gather_scatter(self.cpu, self.dev, plan.swap_in)
        self._gather_scatter(self.dev, self.dev, plan.copies)
        for pairs in (plan.swap_out, plan.tier_loads, plan.swap_in, plan.copies):
            pairs.clear()


STEMS = [(), (0, 1, 2, 0), (0, 1, 2, 0, 1, 1, 2, 2), (2, 2, 2, 2, 2)]
prompts = st.builds(
    lambda stem, tail: list(stem + tuple(tail)) or [0],
    st.sampled_from(STEMS),
    st.lists(st.integers(0, 2), max_size=10),
)
picks = st.integers(0, 10_000)
new_tokens = st.lists(st.integers(0, 2), min_size=MAX_SEQS, max_size=MAX_SEQS)


class BlockManagerMachine(RuleBasedStateMachine):
    enable_caching = True

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS, NUM_CPU_BLOCKS, BS, enable_caching=self.enable_caching)
        self.families: list[Family] = []
        self.mem = Memory()
        self.plan = Plan()  # the current step's block copies
        self.pins: dict[int, tuple[list[int], list[list]]] = {}  # handle -> blocks, contents
        self.next_handle = 0

    # -- helpers -----------------------------------------------------------------------------------
    def _live(self) -> list[Sequence]:
        return [s for f in self.families for s in f.seqs]

    def _in(self, *states: str) -> list[Family]:
        return [f for f in self.families if f.state in states]

    def _demands(self, fam: Family, chunk: int) -> list[Demand]:
        """The scheduler's demands: a lone sequence may prefill in chunks, a group moves whole."""
        if len(fam.seqs) == 1:
            d = demand(self.bm, fam.seqs[0])
            return [replace(d, num_new_tokens=min(chunk, d.num_new_tokens))]
        return [demand(self.bm, s) for s in fam.seqs]

    def _allocate(self, demands: list[Demand]) -> bool:
        """allocate_slots for a group, checking what it may and may not change."""
        bm, pool = self.bm, self.bm.pool
        free_before = pool.num_free
        tables_before = {sid: list(t) for sid, t in bm.tables.items()}
        computed_before = [d.seq.num_computed_tokens for d in demands]
        # the room each demand is counted for, and the copies the writes make in order (a
        # shared block is copied while another sharer is left to write into it in place)
        need = 0
        copies: list[int | None] = []
        refs = Counter()
        for d in demands:
            seq = d.seq
            total = -(-(d.num_computed_tokens + d.num_new_tokens) // BS)
            if d.computed is not None:
                hits = d.computed.blocks
                assert seq.seq_id not in bm.tables
                assert d.computed.num_tokens == len(hits) * BS < len(seq), "never the last token"
                assert [
                    pool.lookup(chain_of(tuple(seq.token_ids[: (i + 1) * BS])))
                    for i in range(len(hits))
                ] == list(hits), "hits follow the chain"
                need += total - len(hits) + sum(pool.is_evictable(b) for b in hits)
                copies.append(None)
                continue
            table = bm.tables[seq.seq_id]
            first = seq.num_computed_tokens // BS
            old = table[first] if first < len(table) else None
            need += total - len(table) + (old is not None and pool.ref[old] > 1)
            shared = old is not None and pool.ref[old] - refs[old] > 1
            if shared:
                refs[old] += 1
            copies.append(old if shared else None)

        made = bm.allocate_slots(demands)
        if made is None:
            assert need > free_before, "room that exists must be given"
            assert pool.num_free == free_before
            assert {sid: list(t) for sid, t in bm.tables.items()} == tables_before
            assert [d.seq.num_computed_tokens for d in demands] == computed_before
            return False
        assert need <= free_before
        taken = free_before - pool.num_free
        assert taken == need if len(demands) == 1 else taken <= need, "the room is counted right"
        ids = {d.seq.seq_id for d in demands}
        assert {sid: t for sid, t in bm.tables.items() if sid not in ids} == {
            sid: t for sid, t in tables_before.items() if sid not in ids
        }
        self.plan.copies += made
        new_copies = iter(made)
        for d, old in zip(demands, copies, strict=True):
            seq, table = d.seq, bm.tables[d.seq.seq_id]
            if d.computed is not None:
                assert seq.num_computed_tokens == d.computed.num_tokens
                assert table[: len(d.computed.blocks)] == list(d.computed.blocks)
                prefix = list(d.computed.blocks)
            else:
                prefix = tables_before[seq.seq_id]
            first = seq.num_computed_tokens // BS
            assert len(table) == -(-(seq.num_computed_tokens + d.num_new_tokens) // BS)
            assert table[:first] == prefix[:first]
            # every block this call writes into is private to the writer
            assert all(pool.ref[b] == 1 for b in table[first:])
            if old is not None:
                assert next(new_copies) == (old, table[first]) and table[first] != old
            elif first < len(prefix):
                assert table[first] == prefix[first]
        assert next(new_copies, None) is None
        return True

    def _schedule(self, fam: Family, chunk: int, tokens: list[int]) -> list[Demand]:
        """Sample (append) where all is computed, then allocate for ``fam`` if it fits."""
        if fam.state == "running":
            for seq, tok in zip(fam.seqs, tokens, strict=False):
                if seq.num_uncomputed == 0:
                    if len(seq) >= MAX_LEN:
                        return []
                    seq.append(tok, 0.0)
        demands = self._demands(fam, chunk)
        if not self._allocate(demands):
            return []
        fam.state = "running"
        return demands

    def _execute(self, demands: list[Demand]) -> None:
        """The rest of the engine step: apply the plan, write the new K/V, commit."""
        self.mem.apply(self.plan)
        for d in demands:
            seq, k = d.seq, d.num_new_tokens
            table = self.bm.tables[seq.seq_id]
            for p in range(seq.num_computed_tokens, seq.num_computed_tokens + k):
                slots = self.mem.dev.setdefault(table[p // BS], [None] * BS)
                slots[p % BS] = tuple(seq.token_ids[: p + 1])
            seq.num_computed_tokens += k
            self.bm.commit(seq)

    def _ref(self, entry: int) -> int:
        """The ref count of a table entry, in the pool it names."""
        return self.bm.cpu_pool.ref[cpu_entry(entry)] if entry < 0 else self.bm.pool.ref[entry]

    def _full_cpu_blocks(self, fam: Family) -> dict[int, bytes]:
        """The group's CPU blocks full of computed tokens, by the chain hash of their tokens."""
        full: dict[int, bytes] = {}
        for seq in fam.seqs:
            table = self.bm.tables[seq.seq_id]
            for i in range(seq.num_computed_tokens // BS):
                if table[i] < 0:
                    full[cpu_entry(table[i])] = chain_of(tuple(seq.token_ids[: (i + 1) * BS]))
        return full

    def _swap_out(self, fam: Family) -> bool:
        bm = self.bm
        refs = Counter(b for s in fam.seqs for b in bm.tables[s.seq_id])
        # only blocks no one else holds (no other group, no pin) leave the device
        leaving = {b for b, n in refs.items() if bm.pool.ref[b] == n}
        tables = {s.seq_id: list(bm.tables[s.seq_id]) for s in fam.seqs}
        cpu_free = bm.cpu_pool.num_free
        pairs = bm.swap_out(fam.seqs)
        if pairs is None:
            assert len(leaving) > cpu_free, "room that exists must be used"
            assert {s.seq_id: bm.tables[s.seq_id] for s in fam.seqs} == tables
            assert bm.cpu_pool.num_free == cpu_free
            return False
        self.plan.swap_out += pairs
        assert sorted(s for s, _ in pairs) == sorted(leaving)
        assert cpu_free - bm.cpu_pool.num_free == len(leaving), "shared blocks move once"
        staying = set(refs) - leaving
        assert all(b in staying or b < 0 for s in fam.seqs for b in bm.tables[s.seq_id])
        fam.state = "swapped"
        return True

    # -- rules -------------------------------------------------------------------------------------
    @precondition(lambda self: len(self._live()) < MAX_SEQS)
    @rule(prompt=prompts)
    def add(self, prompt: list[int]) -> None:
        self.families.append(Family([make_seq(prompt)]))

    @precondition(lambda self: self._in("waiting", "running"))
    @rule(pick=picks, chunk=st.integers(1, 16), tokens=new_tokens)
    def run(self, pick: int, chunk: int, tokens: list[int]) -> None:
        fams = self._in("waiting", "running")
        self._execute(self._schedule(fams[pick % len(fams)], chunk, tokens))

    @precondition(lambda self: self._in("waiting", "running"))
    @rule(chunk=st.integers(1, 16), tokens=new_tokens)
    def step_all(self, chunk: int, tokens: list[int]) -> None:
        """One engine step over every group that fits, oldest first: one plan, one pass."""
        demands = []
        for fam in self._in("waiting", "running"):
            demands += self._schedule(fam, chunk, tokens)
        self._execute(demands)

    @precondition(lambda self: self._in("running", "swapped") and len(self._live()) < MAX_SEQS)
    @rule(pick=picks)
    def fork(self, pick: int) -> None:
        fams = self._in("running", "swapped")
        fam = fams[pick % len(fams)]
        parent = fam.seqs[pick % len(fam.seqs)]
        refs = [self._ref(b) for b in self.bm.tables[parent.seq_id]]
        child = parent.fork()
        self.bm.fork(parent, child)
        assert self.bm.tables[child.seq_id] == self.bm.tables[parent.seq_id]
        assert [self._ref(b) for b in self.bm.tables[child.seq_id]] == [r + 1 for r in refs]
        fam.seqs.append(child)

    @precondition(lambda self: self.families)
    @rule(pick=picks)
    def free(self, pick: int) -> None:
        seqs = self._live()
        seq = seqs[pick % len(seqs)]
        self.bm.free(seq)
        assert seq.seq_id not in self.bm.tables
        for fam in self.families:
            if seq in fam.seqs:
                fam.seqs.remove(seq)
        self.families = [f for f in self.families if f.seqs]

    @precondition(lambda self: self._in("running", "swapped"))
    @rule(pick=picks)
    def reset(self, pick: int) -> None:
        fams = self._in("running", "swapped")
        fam = fams[pick % len(fams)]
        for seq in fam.seqs:
            self.bm.reset(seq)
            assert seq.num_computed_tokens == 0 and seq.seq_id not in self.bm.tables
        fam.state = "waiting"

    @precondition(lambda self: self._in("running"))
    @rule(pick=picks)
    def swap_out(self, pick: int) -> None:
        fams = self._in("running")
        self._swap_out(fams[pick % len(fams)])
        self.mem.apply(self.plan)

    @precondition(lambda self: self._in("swapped"))
    @rule(pick=picks, then_run=st.booleans(), tokens=new_tokens)
    def swap_in(self, pick: int, then_run: bool, tokens: list[int]) -> None:
        fams = self._in("swapped")
        fam = fams[pick % len(fams)]
        bm, pool = self.bm, self.bm.pool
        cpu = {cpu_entry(b) for s in fam.seqs for b in bm.tables[s.seq_id] if b < 0}
        # a block whose contents are still indexed on the device comes back by reference
        # (reviving it if cached); the rest are copied into fresh blocks
        by_ref = {
            c: b for c, h in self._full_cpu_blocks(fam).items() if (b := pool.lookup(h)) is not None
        }
        need = len(cpu) - len(by_ref) + len({b for b in by_ref.values() if pool.is_evictable(b)})
        free = pool.num_free
        tables = {s.seq_id: list(bm.tables[s.seq_id]) for s in fam.seqs}
        pairs = bm.swap_in(fam.seqs)
        if pairs is None:
            assert need > free, "room that exists must be used"
            assert {s.seq_id: bm.tables[s.seq_id] for s in fam.seqs} == tables
            assert pool.num_free == free
            return
        self.plan.swap_in += pairs
        assert sorted(s for s, _ in pairs) == sorted(cpu - set(by_ref))
        assert free - pool.num_free == need
        assert all(b >= 0 for s in fam.seqs for b in bm.tables[s.seq_id])
        fam.state = "running"
        # like the scheduler: the group is stepped in the same plan when it fits
        self._execute(self._schedule(fam, MAX_LEN, tokens) if then_run else [])

    @precondition(lambda self: len(self._in("running")) >= 1 and len(self.families) >= 2)
    @rule(victim=picks, runner=picks, chunk=st.integers(1, 16), tokens=new_tokens)
    def preempt_and_run(self, victim: int, runner: int, chunk: int, tokens: list[int]) -> None:
        """One scheduler step: swap out a running group to make room for another; the
        freed device blocks may be reused by that step's allocations and copies."""
        running = self._in("running")
        v = running[victim % len(running)]
        others = [f for f in self._in("waiting", "running") if f is not v]
        if not others or not self._swap_out(v):
            return
        self._execute(self._schedule(others[runner % len(others)], chunk, tokens))

    @precondition(lambda self: self._in("running"))
    @rule(pick=picks)
    def pin(self, pick: int) -> None:
        seqs = [s for f in self._in("running") for s in f.seqs]
        seq = seqs[pick % len(seqs)]
        handle, self.next_handle = self.next_handle, self.next_handle + 1
        n = self.bm.pin(seq, handle)
        assert n == min(seq.prompt_len, seq.num_computed_tokens) // BS
        blocks = self.bm.tables[seq.seq_id][:n]
        self.pins[handle] = (blocks, [list(self.mem.dev[b]) for b in blocks])

    @precondition(lambda self: self.pins)
    @rule(pick=picks)
    def unpin(self, pick: int) -> None:
        handles = sorted(self.pins)
        handle = handles[pick % len(handles)]
        self.bm.unpin(handle)
        del self.pins[handle]

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def plan_is_applied(self) -> None:
        plan = self.plan
        assert not (plan.copies or plan.swap_out or plan.swap_in or plan.tier_loads)

    @invariant()
    def tables_match_states(self) -> None:
        live = {s.seq_id for s in self._live()}
        assert set(self.bm.tables) <= live
        for fam in self.families:
            for seq in fam.seqs:
                if fam.state == "waiting":
                    assert seq.seq_id not in self.bm.tables and seq.num_computed_tokens == 0
                    continue
                table = self.bm.tables[seq.seq_id]
                assert len(table) == -(-seq.num_computed_tokens // BS)
                assert len(set(table)) == len(table)
                assert seq.num_computed_tokens <= len(seq)
        assert self.bm.num_logical_blocks == sum(
            len(self.bm.tables[s.seq_id]) for f in self._in("running") for s in f.seqs
        )

    def _check_pool(self, pool: BlockPool, refs: Counter, pins: Counter) -> None:
        free = list(pool._free)
        assert len(set(free)) == len(free)
        free_set = set(free)
        hashed = 0
        for b in range(pool.num_blocks):
            assert pool.ref[b] == refs[b] + pins[b], f"block {b}: ref {pool.ref[b]}"
            assert pool.pin_count[b] == pins[b]
            h = pool.block_hash[b]
            if h is not None:
                hashed += 1
                assert pool.lookup(h) == b
            if pool.ref[b] > 0:
                assert b not in free_set and not pool.is_evictable(b)
            else:
                assert (b in free_set) == (h is None)
                assert pool.is_evictable(b) == (h is not None)
        assert len(pool._index) == hashed
        assert pool.num_used == sum(r > 0 for r in pool.ref)
        assert pool.num_shared == sum(r > 1 for r in pool.ref)
        assert pool.num_pinned == sum(p > 0 for p in pool.pin_count)
        assert pool.num_unindexed_free + pool.num_used + pool.num_cached == pool.num_blocks
        assert pool.num_free == pool.num_unindexed_free + pool.num_cached

    @invariant()
    def ref_counts_are_references(self) -> None:
        dev, cpu = Counter(), Counter()
        for fam in self._in("running", "swapped"):
            for seq in fam.seqs:
                for b in self.bm.tables[seq.seq_id]:
                    if b < 0:
                        cpu[cpu_entry(b)] += 1
                    else:
                        dev[b] += 1
        pins = Counter(b for blocks, _ in self.pins.values() for b in blocks)
        self._check_pool(self.bm.pool, dev, pins)
        self._check_pool(self.bm.cpu_pool, cpu, Counter())
        assert not any(h is not None for h in self.bm.cpu_pool.block_hash)
        if not self.enable_caching:
            assert not any(h is not None for h in self.bm.pool.block_hash)

    @invariant()
    def computed_positions_read_back(self) -> None:
        """Every computed token of every sequence is found, with its whole context, through its
        table: no copy-on-write leak into a sibling, no lost swap, no wrong prefix hit."""
        for fam in self._in("running", "swapped"):
            for seq in fam.seqs:
                table = self.bm.tables[seq.seq_id]
                for p in range(seq.num_computed_tokens):
                    b = table[p // BS]
                    mem, b = (self.mem.cpu, cpu_entry(b)) if b < 0 else (self.mem.dev, b)
                    got = mem.get(b, [None] * BS)[p % BS]
                    assert got == tuple(seq.token_ids[: p + 1]), f"seq {seq.seq_id} position {p}"

    @invariant()
    def indexed_blocks_hold_their_tokens(self) -> None:
        """A block reachable by hash (used or cached) holds the full block its chain names."""
        pool = self.bm.pool
        for b in range(pool.num_blocks):
            if pool.block_hash[b] is None:
                continue
            slots = self.mem.dev[b]
            last = slots[-1]
            assert last is not None and len(last) % BS == 0
            start = len(last) - BS
            assert slots == [last[: start + j + 1] for j in range(BS)]
            assert chain_of(last) == pool.block_hash[b]

    @invariant()
    def pinned_blocks_unchanged(self) -> None:
        for blocks, contents in self.pins.values():
            assert [self.mem.dev[b] for b in blocks] == contents

    def teardown(self) -> None:
        for seq in self._live():
            self.bm.free(seq)
        for handle in list(self.pins):
            self.bm.unpin(handle)
        bm = self.bm
        assert not bm.tables and not bm._records  # one record a sequence: every one dropped
        for pool in (bm.pool, bm.cpu_pool):
            assert pool.num_used == 0 and pool.num_shared == 0 and pool.num_pinned == 0
            assert not any(pool.ref) and not any(pool.pin_count)
            assert pool.num_free == pool.num_blocks


class NoCachingMachine(BlockManagerMachine):
    enable_caching = False


class TieredMachine(BlockManagerMachine):
    """The same machine over a disk tier (engine/core/kv_tiers.py) small enough to evict: every
    freed indexed block goes down to it, a lookup reads back what the small pool evicted. The
    simulated K/V travel through a real tensor (a slot holds the id of its prefix), so a block
    read back must hold the very prefixes its chain names (`indexed_blocks_hold_their_tokens`,
    `computed_positions_read_back`)."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = Path(tempfile.mkdtemp(prefix="tiered-machine-"))
        self.kv = torch.zeros(NUM_BLOCKS, BS, dtype=torch.int64)
        self.prefixes: list[tuple | None] = [None]  # slot id -> the prefix it stands for
        self.ids: dict[tuple, int] = {}
        self.tier = DiskTier(self.folder, {"machine": 1}, [self.kv], capacity=16 * 160)
        machine = self

        class Synced(BlockManager):
            """Writes the simulated K/V into the tensor before the tier copies blocks from it;
            puts the blocks it reads back into the step's plan, as the scheduler does."""

            def free(self, seq: Sequence) -> None:
                machine._to_tensor()
                super().free(seq)
                machine.tier.flush()  # (its evictions done: the machine's runs are repeatable)

            def get_computed_blocks(self, seq: Sequence, whole: bool = False) -> ComputedBlocks:
                computed = super().get_computed_blocks(seq, whole)
                for block, payload in self.take_loads():
                    ids = payload.view(torch.int64).tolist()
                    machine.plan.tier_loads.append((block, [machine.prefixes[i] for i in ids]))
                return computed

        self.bm = Synced(NUM_BLOCKS, NUM_CPU_BLOCKS, BS, tier=self.tier)

    def _id(self, prefix: tuple | None) -> int:
        if prefix is None:
            return 0
        if prefix not in self.ids:
            self.ids[prefix] = len(self.prefixes)
            self.prefixes.append(prefix)
        return self.ids[prefix]

    def _to_tensor(self) -> None:
        for b, slots in self.mem.dev.items():
            self.kv[b] = torch.tensor([self._id(p) for p in slots])

    @invariant()
    def tier_books_add_up(self) -> None:
        assert self.bm.audit() == []

    def teardown(self) -> None:
        super().teardown()
        self.tier.close()
        shutil.rmtree(self.folder, ignore_errors=True)


TestBlockManagerStateful = BlockManagerMachine.TestCase
TestBlockManagerStateful = pytest.mark.slow(
    TestBlockManagerStateful
)  # a hypothesis state machine of many steps
TestBlockManagerStateful.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
TestBlockManagerNoCaching = pytest.mark.slow(NoCachingMachine.TestCase)  # many steps
TestBlockManagerNoCaching.settings = settings(TestBlockManagerStateful.settings, max_examples=50)
TestBlockManagerTiered = pytest.mark.slow(TieredMachine.TestCase)
TestBlockManagerTiered.settings = settings(TestBlockManagerStateful.settings, max_examples=60)


# -------------------------------------------------------------------------------------------------
# unit tests
# -------------------------------------------------------------------------------------------------


def test_prefix_reuse_hits_full_blocks_but_never_the_last_token() -> None:
    bm = BlockManager(32, 0, BS)
    base = list(range(12))  # exactly three full blocks
    a = make_seq(base)
    assert compute(bm, a) == 0
    a_table = list(bm.tables[a.seq_id])

    same = make_seq(base)  # the last token must be computed for its logits: two blocks reused
    d = demand(bm, same)
    assert d.computed is not None and d.computed.num_tokens == 8 and d.num_new_tokens == 4
    free = bm.pool.num_free
    assert compute(bm, same) == 8
    assert free - bm.pool.num_free == 1  # the hits are in use by `a`: nothing else taken
    assert bm.tables[same.seq_id][:2] == a_table[:2]
    assert bm.tables[same.seq_id][2] != a_table[2]
    assert bm.pool.ref[a_table[0]] == bm.pool.ref[a_table[1]] == 2

    longer = make_seq(base + [99])
    assert compute(bm, longer) == 12
    assert bm.tables[longer.seq_id][:3] == a_table

    differs = make_seq(base[:4] + [77] + base[5:])  # second block differs: the chain breaks
    assert compute(bm, differs) == 4
    assert compute(bm, make_seq(base[:3])) == 0  # no full block
    assert bm.prefix_hit_tokens == 8 + 12 + 4

    # reuse survives the owners being freed: the blocks wait in the cache
    for seq in (a, same, longer, differs):
        bm.free(seq)
    again = make_seq(base + [5])
    assert demand(bm, again).computed == ComputedBlocks(tuple(a_table), 12)
    # three cached hits leave the free count, plus one fresh block for the last token
    free = bm.pool.num_free
    assert compute(bm, again) == 12
    assert free - bm.pool.num_free == 4
    assert bm.tables[again.seq_id][:3] == a_table

    off = BlockManager(32, 0, BS, enable_caching=False)
    compute(off, make_seq(base))
    assert compute(off, make_seq(base + [1])) == 0


def test_lru_evicts_freed_tails_before_heads() -> None:
    bm = BlockManager(6, 0, BS)
    a = make_seq(list(range(12)))
    compute(bm, a)
    a0, a1, a2 = bm.tables[a.seq_id]
    bm.free(a)  # tail first: a2 is the least recently released
    assert bm.pool.num_cached == 3 and bm.pool.num_unindexed_free == 3

    hashes = [bm.pool.block_hash[b] for b in (a0, a1, a2)]
    b = make_seq([50 + i for i in range(16)])  # four blocks: three free ones, then one eviction
    compute(bm, b)
    assert bm.pool.evictions == 1
    assert bm.pool.lookup(hashes[2]) is None and a2 in bm.tables[b.seq_id]
    assert bm.pool.lookup(hashes[0]) == a0 and bm.pool.lookup(hashes[1]) == a1

    c = make_seq([90, 91, 92, 93, 94])  # two more blocks: a1 goes before a0
    compute(bm, c)
    assert bm.pool.evictions == 3
    assert bm.pool.lookup(hashes[0]) is None and bm.pool.lookup(hashes[1]) is None
    assert bm.tables[c.seq_id] == [a1, a0]
    assert bm.pool.num_free == 0
    assert not bm.allocate_slots([demand(bm, make_seq([1]))])
    with pytest.raises(RuntimeError):
        bm.pool.allocate()


def test_lru_reuse_refreshes_a_cached_block() -> None:
    bm = BlockManager(4, 0, BS)
    x, y = make_seq([1] * 4 + [0]), make_seq([2] * 4 + [0])
    compute(bm, x)
    compute(bm, y)
    x0, y0 = bm.tables[x.seq_id][0], bm.tables[y.seq_id][0]
    bm.free(x)
    bm.free(y)
    # two cached blocks, x's released first; a hit on x's block makes it the newest again
    hit = make_seq([1] * 4 + [3])
    assert compute(bm, hit) == 4
    bm.free(hit)
    z = make_seq([7] * 12)  # three blocks: the two free ones, then y's is evicted
    compute(bm, z)
    assert bm.pool.evictions == 1
    assert bm.pool.lookup(chain_of((2,) * 4)) is None and bm.tables[z.seq_id][2] == y0
    assert bm.pool.lookup(chain_of((1,) * 4)) == x0


def test_pinned_blocks_are_never_evicted() -> None:
    bm = BlockManager(8, 0, BS)
    persona = list(range(100, 108))  # two full prompt blocks
    p = make_seq(persona)
    compute(bm, p)
    p.append(5, 0.0)  # its sampled token, never computed: the request finishes here
    assert bm.pin(p, handle=7) == 2
    pinned = bm.tables[p.seq_id][:2]
    bm.free(p)
    assert bm.pool.num_pinned == 2 and bm.pool.num_used == 2
    assert not any(bm.pool.is_evictable(b) for b in pinned)

    other = make_seq(list(range(8)))  # cached, unpinned: the only thing that may be evicted
    compute(bm, other)
    bm.free(other)
    hog = make_seq([9] * 24)  # the six blocks that are not pinned
    too_long = make_seq([9] * 25)
    assert not bm.allocate_slots([demand(bm, too_long)])
    assert too_long.seq_id not in bm.tables and bm.pool.evictions == 0
    compute(bm, hog)  # (compute asserts that it fits)
    assert bm.pool.evictions == 2 and bm.pool.num_free == 0
    assert [bm.pool.ref[b] for b in pinned] == [1, 1]

    bm.free(hog)
    user = make_seq(persona + [1, 2, 3])
    assert compute(bm, user) == 8
    assert bm.tables[user.seq_id][:2] == pinned
    bm.free(user)

    bm.unpin(7)
    bm.unpin(7)  # unknown handle: ignored
    assert bm.pool.num_pinned == 0 and bm.pool.num_used == 0
    assert all(bm.pool.is_evictable(b) for b in pinned)
    last = make_seq([4] * 32)  # every block: unpinned, the persona's may be evicted again
    compute(bm, last)
    assert set(pinned) <= set(bm.tables[last.seq_id])
    assert bm.pool.lookup(chain_of(tuple(persona[:4]))) is None


def test_copy_on_write_after_fork_splits_only_the_partial_block() -> None:
    bm = BlockManager(16, 0, BS)
    parent = make_seq([1, 2, 3, 4, 5, 6])  # one full block, one partial
    compute(bm, parent)
    child = parent.fork()  # n = 2: both samples continue from one prefill
    bm.fork(parent, child)
    b0, b1 = bm.tables[parent.seq_id]
    assert bm.tables[child.seq_id] == [b0, b1]
    assert bm.pool.ref[b0] == bm.pool.ref[b1] == 2 and bm.pool.num_shared == 2

    parent.append(10, 0.0)
    child.append(20, 0.0)
    free = bm.pool.num_free
    _, copies = step(bm, parent)
    fresh = bm.tables[parent.seq_id][1]
    assert bm.tables[parent.seq_id] == [b0, fresh] and fresh not in (b0, b1)
    assert copies == [(b1, fresh)]
    assert free - bm.pool.num_free == 1  # the copy
    assert bm.pool.ref[b1] == bm.pool.ref[fresh] == 1 and bm.pool.ref[b0] == 2

    free = bm.pool.num_free
    assert step(bm, child)[1] == []
    assert bm.pool.num_free == free  # the last sharer writes in place
    assert bm.tables[child.seq_id] == [b0, b1]
    assert bm.pool.num_shared == 1  # the full prompt block stays shared


def test_fork_on_a_block_boundary_shares_every_prompt_block() -> None:
    bm = BlockManager(16, 0, BS)
    parent = make_seq(list(range(8)))  # exactly two full blocks
    compute(bm, parent)
    children = [parent.fork() for _ in range(3)]
    for c in children:
        bm.fork(parent, c)
    prompt_blocks = list(bm.tables[parent.seq_id])
    for i, seq in enumerate([parent, *children]):
        seq.append(i, 0.0)
        free = bm.pool.num_free
        assert step(bm, seq)[1] == []
        assert free - bm.pool.num_free == 1
        assert bm.tables[seq.seq_id][:2] == prompt_blocks
    assert [bm.pool.ref[b] for b in prompt_blocks] == [4, 4]
    assert len({bm.tables[s.seq_id][2] for s in [parent, *children]}) == 4


def test_swap_moves_shared_blocks_once_and_keeps_sharing() -> None:
    bm = BlockManager(16, 16, BS)
    parent = make_seq([1, 2, 3, 4, 5, 6])
    compute(bm, parent)
    child = parent.fork()
    bm.fork(parent, child)
    for seq, tok in ((parent, 7), (child, 8)):
        seq.append(tok, 0.0)
        compute(bm, seq)
    tables = {s.seq_id: list(bm.tables[s.seq_id]) for s in (parent, child)}
    out = bm.swap_out([parent, child])
    assert out is not None and len(out) == 3  # one shared block, two private ones
    moved = dict(out)
    for seq in (parent, child):
        assert bm.tables[seq.seq_id] == [cpu_entry(moved[b]) for b in tables[seq.seq_id]]
    assert bm.cpu_pool.num_used == 3 and bm.cpu_pool.num_shared == 1
    assert bm.pool.num_used == 0 and bm.num_logical_blocks == 0

    back = bm.swap_in([parent, child])
    # the full shared block is still cached on the device: it comes back without a copy
    assert back is not None and len(back) == 2 and bm.cpu_pool.num_used == 0
    assert bm.pool.num_used == 3 and bm.pool.num_shared == 1
    assert bm.tables[parent.seq_id][0] == bm.tables[child.seq_id][0]
    bm.free(parent)
    bm.free(child)
    assert bm.pool.num_used == 0


def test_swap_leaves_blocks_held_by_others_on_the_device() -> None:
    bm = BlockManager(16, 16, BS)
    owner = make_seq(list(range(9)))
    compute(bm, owner)
    bm.pin(owner, "persona")
    sharer = make_seq(list(range(8)) + [50, 51, 52])
    assert compute(bm, sharer) == 8  # two blocks shared with the owner (and pinned)
    bm.free(owner)
    shared = bm.tables[sharer.seq_id][:2]
    out = bm.swap_out([sharer])
    assert out is not None and len(out) == 1 and bm.tables[sharer.seq_id][:2] == shared
    assert [bm.pool.ref[b] for b in shared] == [2, 2]
    bm.swap_in([sharer])
    assert bm.tables[sharer.seq_id][:2] == shared and bm.cpu_pool.num_used == 0
    bm.free(sharer)
    bm.unpin("persona")
    assert bm.pool.num_used == 0


def test_chain_hash_is_sha256_of_parent_and_tokens() -> None:
    import hashlib
    from array import array

    first = chain_hash(None, (1, 2, 3, 4))
    assert first == hashlib.sha256(array("q", (1, 2, 3, 4)).tobytes()).digest()
    assert chain_hash(first, (5, 6, 7, 8)) != chain_hash(None, (5, 6, 7, 8))
    # Python's hash((None, t)) is the same for -1 and -2 in a tuple slot; sha256 is not
    assert chain_hash(None, (-1,)) != chain_hash(None, (-2,))


# -------------------------------------------------------------------------------------------------
# KV groups with sliding windows (the hybrid layout: a full group and two sliding ones)
# -------------------------------------------------------------------------------------------------

WINDOWS = (0, 6, 9)


class SlidingGroupsMachine(RuleBasedStateMachine):
    """The engine's use of a BlockManager with a full-attention group and two sliding groups:
    prefill in chunks, decode, fork, free, recompute, swap, pins and prefix hits. Each group's
    simulated K/V must read back every position a next query's window needs; a sliding group
    holds at most ceil(window / block_size) + 1 blocks per sequence between steps."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(NUM_BLOCKS * 2, NUM_CPU_BLOCKS * 2, BS, windows=WINDOWS)
        self.families: list[Family] = []
        self.mem = [Memory() for _ in WINDOWS]  # per group (one pool, each group's own blocks)
        self.plan = Plan()
        self.next_handle = 0

    def _live(self) -> list[Sequence]:
        return [s for f in self.families for s in f.seqs]

    def _in(self, *states: str) -> list[Family]:
        return [f for f in self.families if f.state in states]

    def _apply(self) -> None:
        # one pool: a copy moves a block's contents in every group's view of it
        for mem in self.mem:
            mem.apply(
                replace(
                    self.plan,
                    swap_out=list(self.plan.swap_out),
                    swap_in=list(self.plan.swap_in),
                    copies=list(self.plan.copies),
                )
            )
        self.plan = Plan()

    def _step(self, fam: Family, chunk: int, tokens: list[int]) -> None:
        if fam.state == "running":
            for seq, tok in zip(fam.seqs, tokens, strict=False):
                if seq.num_uncomputed == 0:
                    if len(seq) >= MAX_LEN:
                        return
                    seq.append(tok, 0.0)
        if len(fam.seqs) == 1:
            d = demand(self.bm, fam.seqs[0])
            demands = [replace(d, num_new_tokens=min(chunk, d.num_new_tokens))]
        else:
            demands = [demand(self.bm, s) for s in fam.seqs]
        for d in demands:
            if d.computed is not None:  # a hit serves every group's window at its length
                n = d.computed.num_tokens // BS
                for g, w in enumerate(WINDOWS):
                    lo = max(0, (n * BS - w + 1) // BS) if w else 0
                    assert len(d.computed.hits(g)) == n - lo
        copies = self.bm.allocate_slots(demands)
        if copies is None:
            return
        fam.state = "running"
        self.plan.copies += copies
        self._apply()
        for d in demands:
            seq, k = d.seq, d.num_new_tokens
            for g in range(len(WINDOWS)):
                table = self.bm.group_tables[g][seq.seq_id]
                for p in range(seq.num_computed_tokens, seq.num_computed_tokens + k):
                    slots = self.mem[g].dev.setdefault(table[p // BS], [None] * BS)
                    slots[p % BS] = tuple(seq.token_ids[: p + 1])
            seq.num_computed_tokens += k
            self.bm.commit(seq)

    @precondition(lambda self: len(self._live()) < MAX_SEQS)
    @rule(prompt=prompts)
    def add(self, prompt: list[int]) -> None:
        self.families.append(Family([make_seq(prompt * 2)]))

    @precondition(lambda self: self._in("waiting", "running"))
    @rule(pick=picks, chunk=st.integers(1, 16), tokens=new_tokens)
    def run(self, pick: int, chunk: int, tokens: list[int]) -> None:
        fams = self._in("waiting", "running")
        self._step(fams[pick % len(fams)], chunk, tokens)

    @precondition(lambda self: self._in("running", "swapped") and len(self._live()) < MAX_SEQS)
    @rule(pick=picks)
    def fork(self, pick: int) -> None:
        fams = self._in("running", "swapped")
        fam = fams[pick % len(fams)]
        parent = fam.seqs[pick % len(fam.seqs)]
        child = parent.fork()
        self.bm.fork(parent, child)
        fam.seqs.append(child)

    @precondition(lambda self: self.families)
    @rule(pick=picks)
    def free(self, pick: int) -> None:
        seq = self._live()[pick % len(self._live())]
        self.bm.free(seq)
        for fam in self.families:
            if seq in fam.seqs:
                fam.seqs.remove(seq)
        self.families = [f for f in self.families if f.seqs]

    @precondition(lambda self: self._in("running", "swapped"))
    @rule(pick=picks)
    def reset(self, pick: int) -> None:
        fams = self._in("running", "swapped")
        fam = fams[pick % len(fams)]
        for seq in fam.seqs:
            self.bm.reset(seq)
        fam.state = "waiting"

    @precondition(lambda self: self._in("running"))
    @rule(pick=picks)
    def swap_out(self, pick: int) -> None:
        fams = self._in("running")
        fam = fams[pick % len(fams)]
        pairs = self.bm.swap_out(fam.seqs)
        if pairs is not None:
            self.plan.swap_out += pairs
            self._apply()
            fam.state = "swapped"

    @precondition(lambda self: self._in("swapped"))
    @rule(pick=picks)
    def swap_in(self, pick: int) -> None:
        fams = self._in("swapped")
        fam = fams[pick % len(fams)]
        pairs = self.bm.swap_in(fam.seqs)
        if pairs is not None:
            self.plan.swap_in += pairs
            self._apply()
            fam.state = "running"

    @precondition(lambda self: self._in("running"))
    @rule(pick=picks)
    def pin_and_unpin(self, pick: int) -> None:
        seqs = [s for f in self._in("running") for s in f.seqs]
        self.bm.pin(seqs[pick % len(seqs)], self.next_handle)
        if pick % 2:
            self.bm.unpin(self.next_handle)
        self.next_handle += 1

    @invariant()
    def audit_is_clean(self) -> None:
        assert self.bm.audit() == []
        pool = self.bm.pool
        free = set(pool._free)
        assert all(pool.ref[b] == 0 for b in free), "a block both free and used"
        assert pool.num_unindexed_free + pool.num_used + pool.num_cached == pool.num_blocks

    @invariant()
    def sliding_groups_hold_only_their_window(self) -> None:
        for fam in self._in("running", "swapped"):
            for seq in fam.seqs:
                for g, w in enumerate(WINDOWS):
                    held = self.bm.record(seq.seq_id).held(g)
                    if w:
                        assert len(held) <= -(-w // BS) + 1
                    else:
                        assert self.bm.record(seq.seq_id).skipped[g] == 0

    @invariant()
    def the_window_reads_back(self) -> None:
        """Every key the next query of a sequence reads, in every group, is its own."""
        for fam in self._in("running", "swapped"):
            for seq in fam.seqs:
                c = seq.num_computed_tokens
                for g, w in enumerate(WINDOWS):
                    table = self.bm.group_tables[g][seq.seq_id]
                    for p in range(max(0, c - w + 1) if w else 0, c):
                        b = table[p // BS]
                        mem, b = (self.mem[g].cpu, cpu_entry(b)) if b < 0 else (self.mem[g].dev, b)
                        got = mem.get(b, [None] * BS)[p % BS]
                        assert got == tuple(seq.token_ids[: p + 1]), f"group {g} position {p}"

    def teardown(self) -> None:
        for seq in self._live():
            self.bm.free(seq)
        for handle in range(self.next_handle):
            self.bm.unpin(handle)
        assert self.bm.pool.num_used == 0 and self.bm.cpu_pool.num_used == 0
        assert all(not t for t in self.bm.group_tables)


TestSlidingGroupsStateful = SlidingGroupsMachine.TestCase
TestSlidingGroupsStateful = pytest.mark.slow(
    TestSlidingGroupsStateful
)  # a hypothesis state machine of many steps
TestSlidingGroupsStateful.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
