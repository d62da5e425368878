"""FCFS iteration-level scheduler with token/sequence budgets and all-or-nothing preemption.

Every step: running groups (oldest first) get their next token or prefill chunk; when blocks run
out, the most recently arrived group is preempted as a whole (recompute or swap). Swapped groups
come back before waiting ones are admitted. After the forward pass, ``update_from_output`` takes
the sampler's picks: it appends them, forks n samples and beams, runs the stop check, and finishes
and frees what ended.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import replace

from chatpage.engine.config import EngineConfig, PreemptionMode
from chatpage.engine.core.beam import BeamSearch
from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.block_table import Demand
from chatpage.engine.core.sequence import GroupStatus, Sequence, SequenceGroup
from chatpage.engine.core.speculate import Speculator
from chatpage.engine.core.step import (
    BeamCandidates,
    BlockCopies,
    Sample,
    SamplerOutput,
    ScheduledSeq,
    SchedulerOutput,
    StepResult,
)
from chatpage.engine.core.stop import StopCheck


class Scheduler:
    """Owns the waiting / running / swapped queues, and every sequence's life in them: what runs
    each step, and what the step's picks do to it (append, fork, stop, finish, free)."""

    def __init__(
        self,
        config: EngineConfig,
        block_manager: BlockManager,
        stop: StopCheck,
        speculator: Speculator | None = None,
    ) -> None:
        self.config = config
        self.bm = block_manager
        self.stop = stop
        self.speculator = speculator if speculator is not None and speculator.enabled else None
        self.beam = BeamSearch(block_manager, stop)
        self.waiting: deque[SequenceGroup] = deque()
        self.running: list[SequenceGroup] = []  # sorted by arrival time
        self.swapped: deque[SequenceGroup] = deque()
        self.preemptions = {PreemptionMode.RECOMPUTE: 0, PreemptionMode.SWAP: 0}
        # keep a few blocks free when admitting new work, so running groups can grow a little
        self.watermark = max(1, block_manager.pool.num_blocks // 100)

    # -- queues ----------------------------------------------------------------------------------
    def add(self, group: SequenceGroup) -> None:
        self.waiting.append(group)
        self.bm.read_ahead(group.seqs[0])  # (its disk hits, while earlier steps run)

    def pin_cached(self, group: SequenceGroup) -> bool:
        """Pin the persona prefix of ``group`` (waiting, not started) straight from the prefix
        cache, device or tier, when that holds all of it (`BlockManager.pin_hits`): the group
        is then finished without a step. Returns whether it was."""
        seq = group.seqs[0]
        computed = self.bm.get_computed_blocks(seq, whole=True)
        if not self.bm.pin_hits(seq, computed, group.request_id):
            return False
        self.waiting.remove(group)
        group.prefix_hit_tokens = computed.num_tokens
        group.status = GroupStatus.FINISHED
        group.finish_time = time.monotonic()
        return True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def remove(self, group: SequenceGroup) -> None:
        """Take a group out of whichever queue holds it and free its blocks."""
        for queue in (self.waiting, self.swapped):
            if group in queue:
                queue.remove(group)
        if group in self.running:
            self.running.remove(group)
        for seq in group.seqs:
            self.bm.free(seq)

    def _insert_running(self, group: SequenceGroup) -> None:
        group.status = GroupStatus.RUNNING
        keys = [g.arrival_time for g in self.running]
        self.running.insert(bisect.bisect_right(keys, group.arrival_time), group)

    # -- demands ---------------------------------------------------------------------------------
    def _demands(self, group: SequenceGroup, budget: int, alone: bool) -> list[Demand]:
        """What each live sequence of ``group`` computes this step within ``budget`` tokens.

        A waiting group has no blocks yet: its prefix hits are looked up here, once, and the
        allocation starts from them. A single sequence may prefill in chunks; a group of several
        moves together (all of its sequences or none), so beams and samples stay in step.
        ``alone`` lets the first group of an empty step exceed the budget rather than stall.
        """
        new = group.status is GroupStatus.WAITING
        demands = []
        for seq in group.live_seqs:
            computed = self.bm.get_computed_blocks(seq) if new else None
            start = seq.num_computed_tokens if computed is None else computed.num_tokens
            demands.append(Demand(seq, len(seq) - start, computed))
        if len(demands) == 1:
            k = self._tail_apart(demands[0].seq, len(demands[0].seq) - demands[0].num_new_tokens)
            k = min(demands[0].num_new_tokens, budget, k)
            return [replace(demands[0], num_new_tokens=k)] if k > 0 else []
        total = sum(d.num_new_tokens for d in demands)
        return demands if total <= budget or alone else []

    def _tail_apart(self, seq: Sequence, start: int) -> int:
        """The most tokens a chunk of ``seq`` from ``start`` may have: a prompt stops at its
        last full block, and its tail (what a later request for the same prompt computes over
        the cached blocks: a regenerate) is a chunk of its own, so the tail's KV and logits are
        the same bits both times: a greedy reply over a cached prompt is the one it was cold,
        and a greedy regenerate repeats the reply it replaces, every draft of it kept
        (`engine/core/speculate.py`). One more small step for a cold prompt."""
        tail = (len(seq) - 1) // self.bm.block_size * self.bm.block_size
        return tail - start if self.bm.enable_caching and start < tail else len(seq)

    # -- preemption ------------------------------------------------------------------------------
    def _mode(self, group: SequenceGroup) -> PreemptionMode:
        """How to preempt ``group``, if the CPU pool has room for a swap (else ``_preempt``
        recomputes). Groups of several sequences always swap, whatever the mode: recomputed,
        each sequence would prefill its own copy of the shared blocks, which may never fit
        again."""
        mode = PreemptionMode(self.config.preemption_mode)
        several = len(group.live_seqs) > 1
        if mode is PreemptionMode.AUTO or several:
            mode = PreemptionMode.SWAP if several else PreemptionMode.RECOMPUTE
        return mode

    def _preempt(self, group: SequenceGroup, out: SchedulerOutput) -> None:
        self.running.remove(group)
        mode = self._mode(group)
        pairs = self.bm.swap_out(group.live_seqs) if mode is PreemptionMode.SWAP else None
        if pairs is None:
            mode = PreemptionMode.RECOMPUTE  # no CPU space left: dropping the KV is the only way
            self._recompute(group)
        else:
            out.swap_out += pairs
            group.status = GroupStatus.SWAPPED
            self.swapped.append(group)
        self.preemptions[mode] += 1
        out.preempted.append(group)

    def _recompute(self, group: SequenceGroup) -> None:
        """Drop the group's KV and put it at the head of the waiting queue."""
        for seq in group.live_seqs:
            self.bm.reset(seq)
        group.status = GroupStatus.WAITING
        self.waiting.appendleft(group)

    # -- the step --------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        seq_budget = self.config.max_num_seqs

        def take(group: SequenceGroup, demands: list[Demand], copies: BlockCopies) -> None:
            """Schedule ``demands``, whose blocks are allocated (with these copies)."""
            nonlocal budget, seq_budget
            out.copies += copies
            if not group.started:
                group.prefix_hit_tokens += sum(
                    d.computed.num_tokens for d in demands if d.computed is not None
                )
                group.disk_hit_tokens += sum(
                    d.computed.from_tier for d in demands if d.computed is not None
                )
            for d in demands:
                ends = d.seq.num_computed_tokens + d.num_new_tokens == len(d.seq)
                out.scheduled.append(ScheduledSeq(group, d.seq, d.num_new_tokens, ends))
                budget -= d.num_new_tokens
            seq_budget -= len(demands)
            group.started = True

        # 1. running groups, oldest first; preempt the newest when blocks run out
        i = 0
        while i < len(self.running):
            group = self.running[i]
            demands = self._demands(group, budget, alone=not out.scheduled)
            if not demands or len(demands) > seq_budget:
                i += 1
                continue
            while (copies := self.bm.allocate_slots(demands)) is None:
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is group:
                    break
            else:
                take(group, demands, copies)
                i += 1

        # 2. swapped groups come back first, in order, if nothing was preempted this step; their
        # prefill resumes in chunks like any other. With nothing else on the device, the
        # watermark is waived, and a group that still cannot come back (pins took its room) is
        # recomputed instead: step 3 runs it, or fails it if it can never fit.
        while self.swapped and not out.preempted:
            group = self.swapped[0]
            seqs = group.live_seqs
            if len(seqs) > seq_budget:
                break
            idle = not self.running and not out.scheduled
            pairs = self.bm.swap_in(seqs, reserve=0 if idle else self.watermark)
            if pairs is None:
                if not idle:
                    break
                self.swapped.popleft()
                self._recompute(group)
                continue
            self.swapped.popleft()
            out.swap_in += pairs
            demands = self._demands(group, budget, alone=not out.scheduled)
            copies = self.bm.allocate_slots(demands) if demands else []
            if idle and copies is None:
                self._recompute(group)  # alone on the device and still no room to step
                continue
            self._insert_running(group)
            if not demands or copies is None:
                break  # swapped back; it steps when there is room
            take(group, demands, copies)

        # 3. waiting groups, strictly first come first served
        while self.waiting and not self.swapped and not out.preempted:
            group = self.waiting[0]
            if out.scheduled and self.bm.reading_ahead(group.seqs[0]):
                break  # (its blocks are still coming from disk: it waits while others run)
            demands = self._demands(group, budget, alone=not out.scheduled)
            if not demands or len(demands) > seq_budget:
                break
            reserve = self.watermark if self.running else 0
            copies = self.bm.allocate_slots(demands, reserve=reserve)
            if copies is None:
                break
            self.waiting.popleft()
            take(group, demands, copies)
            self._insert_running(group)
        if self.speculator is not None:
            self._draft(out)
        out.tier_loads = self.bm.take_loads()
        return out

    def _draft(self, out: SchedulerOutput) -> None:
        """Add drafted tokens to the decode rows of a step that is all decode rows with nothing
        waiting (``engine/core/speculate.py``); a draft whose blocks do not fit is dropped."""
        assert self.speculator is not None
        if out.preempted or self.waiting or self.swapped or out.swap_in:
            return
        if len(out.scheduled) >= self.speculator.exact_rows:
            return  # (no row to spare within the exact ones)
        if not all(i.num_new_tokens == 1 and i.samples for i in out.scheduled):
            return
        budget = self.config.max_num_batched_tokens - len(out.scheduled)
        rows = [(i.group, i.seq) for i in out.scheduled]
        for n, (item, draft) in enumerate(
            zip(out.scheduled, self.speculator.plan(rows, budget), strict=True)
        ):
            left = self.stop.max_model_len - len(item.seq) - 1
            draft = draft[: max(0, left)]
            if not draft:
                continue
            # (the watermark kept: a draft never takes the blocks a next step needs)
            demand = [Demand(item.seq, 1 + len(draft))]
            if self.bm.allocate_slots(demand, self.watermark) is not None:
                out.scheduled[n] = replace(item, num_new_tokens=1 + len(draft), draft=tuple(draft))

    def stuck(self, out: SchedulerOutput) -> SequenceGroup | None:
        """The head of the waiting queue when ``out`` runs nothing with the device otherwise
        empty: it needs more blocks than exist unpinned, so it would wait forever. (None after
        a preemption: the next step tries again.)"""
        if out.scheduled or out.preempted or self.running or self.swapped or not self.waiting:
            return None
        return self.waiting[0]

    # -- after the step ----------------------------------------------------------------------------
    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampler_output: SamplerOutput
    ) -> StepResult:
        """The step ran ``scheduler_output``: advance each chunk's computed tokens (indexing the
        blocks they filled), then update each group from the sampler's picks (`_update`).
        Returns the groups that moved, in the order of the sampler's picks and then those that
        only advanced a prompt chunk, and the requests that failed: in the sampler, or in their
        own update (a request whose update raises fails alone, as a row the sampler cannot
        draw; the engine ends it, which frees its blocks)."""
        for item in scheduler_output.scheduled:
            if not item.draft:  # (a drafted row's count waits for its kept tokens: below)
                item.seq.num_computed_tokens += item.num_new_tokens
                self.bm.commit(item.seq)
        result = StepResult(failed=dict(sampler_output.failed))
        picks: dict[str, tuple[SequenceGroup, list[Sample], BeamCandidates | None]] = {}
        for sample in sampler_output.samples:
            picks.setdefault(sample.group.request_id, (sample.group, [], None))[1].append(sample)
        for proposals in sampler_output.beams:
            picks[proposals.group.request_id] = (proposals.group, [], proposals)
        for rid, (group, samples, beams) in picks.items():
            try:
                self._update(group, samples, beams)
            except Exception as e:
                result.failed[rid] = e
            else:
                result.moved.append(group)
        for item in scheduler_output.scheduled:
            if item.draft:
                self._verified(item, sampler_output.accepted.get(item.seq.seq_id, 0))
        # a prompt chunk that picks no token yet still says how far the prefill is
        seen = {*picks, *result.failed}
        for item in scheduler_output.scheduled:
            if not item.samples and item.group.request_id not in seen:
                seen.add(item.group.request_id)
                result.moved.append(item.group)
        return result

    def _verified(self, item: ScheduledSeq, accepted: int) -> None:
        """Roll a drafted row forward by the tokens whose KV it computed and kept: its decode
        row's and its ``accepted`` drafts' (the rejected rows' slots are overwritten later,
        their blocks given back, never indexed)."""
        seq = item.seq
        assert self.speculator is not None
        self.speculator.verified(seq, len(item.draft), accepted)
        if not self.bm.holds(seq):  # (it finished, and its blocks went)
            return
        seq.num_computed_tokens = min(seq.num_computed_tokens + 1 + accepted, len(seq) - 1)
        self.bm.commit(seq)
        self.bm.trim(seq)

    def _update(
        self, group: SequenceGroup, samples: list[Sample], beams: BeamCandidates | None
    ) -> None:
        """Append ``group``'s picks (forking n samples; beams through their beam step), stop
        what ended, free its finished sequences (pinning a persona prefix first) and finish it
        when no sequence is left live."""
        targets: list[tuple[Sample, Sequence]] = []
        for sample in samples:  # forks first: they copy the parent as it was
            seq = sample.seq
            if sample.fork is not None:
                seq = group.fork(sample.seq, sample.fork)
                seq.generator = sample.generator
                self.bm.fork(sample.seq, seq)
            targets.append((sample, seq))
        for sample, seq in targets:
            if seq.finished:  # (a drafted sequence's later picks, past a token that ended it)
                continue
            seq.append(sample.token, sample.logprob, sample.top)
            seq.finish_reason = self.stop(group.params, seq)
        if beams is not None:
            self.beam.step(beams)
        now = time.monotonic()
        if group.first_token_time is None:
            group.first_token_time = now
        for seq in group.seqs:
            if seq.finished and self.bm.holds(seq):
                if group.pin_prefix:
                    self.bm.pin(seq, group.request_id)
                self.bm.free(seq)
        if not group.live_seqs:  # (a beam step may have dropped every sequence)
            group.status = GroupStatus.FINISHED
            group.finish_time = now
            self.running.remove(group)
