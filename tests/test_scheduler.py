"""Scheduler over a real BlockManager (no model): token and sequence budgets, chunked prefill,
preemption order, and swapped groups that cannot come back as they are."""

from __future__ import annotations

from chatpage.engine.block_manager import BlockManager
from chatpage.engine.config import EngineConfig
from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.scheduler import Scheduler, SchedulerOutput
from chatpage.engine.sequence import GroupStatus, Sequence, SequenceGroup

BS = 16


class _Detok:
    def copy(self) -> _Detok:
        return self


def _scheduler(blocks: int, **config) -> Scheduler:
    cfg = EngineConfig(block_size=BS, **config)
    return Scheduler(cfg, BlockManager(blocks, 32, BS, enable_caching=False))


def _group(sched: Scheduler, rid: str, prompt_len: int, t: float) -> SequenceGroup:
    tokens = [7 + i % 50 for i in range(prompt_len)]
    group = SequenceGroup(rid, tokens, SamplingParams(temperature=0),
                          [Sequence(list(tokens), prompt_len, _Detok())], arrival_time=t)
    sched.add(group)
    return group


def _step(sched: Scheduler) -> SchedulerOutput:
    """What the engine does around schedule(): compute, then append a token where all is done."""
    out = sched.schedule()
    for item in out.scheduled:
        item.seq.num_computed_tokens += item.num_new_tokens
        if item.seq.num_computed_tokens == len(item.seq):
            item.seq.append(5, 0.0)
    return out


def _scheduled(out: SchedulerOutput) -> dict[str, int]:
    return {item.group.request_id: item.num_new_tokens for item in out.scheduled}


def test_token_budget_chunks_prefill_oldest_first():
    sched = _scheduler(32, max_num_batched_tokens=32)
    _group(sched, "a", 40, 1.0)
    _group(sched, "b", 40, 2.0)
    assert _scheduled(_step(sched)) == {"a": 32}
    assert _scheduled(_step(sched)) == {"a": 8, "b": 24}
    assert _scheduled(_step(sched)) == {"a": 1, "b": 16}
    assert _scheduled(_step(sched)) == {"a": 1, "b": 1}


def test_sequence_budget_caps_the_batch():
    sched = _scheduler(32, max_num_seqs=2)
    for i, rid in enumerate("abc"):
        _group(sched, rid, 5, float(i))
    assert _scheduled(_step(sched)) == {"a": 5, "b": 5}
    assert [g.request_id for g in sched.waiting] == ["c"]


def test_the_newest_running_group_is_preempted_first():
    sched = _scheduler(6, preemption_mode="recompute")
    a = _group(sched, "a", 32, 1.0)
    b = _group(sched, "b", 32, 2.0)
    c = _group(sched, "c", 16, 3.0)
    _step(sched)  # a and b take 2 blocks each, c one (plus the watermark)
    assert {g.request_id for g in sched.running} == {"a", "b", "c"}
    out = _step(sched)  # a and b cross into a third block: the newest, c, makes room
    assert out.preempted == [c] and c.status is GroupStatus.WAITING
    assert sched.waiting[0] is c and c.seqs[0].num_computed_tokens == 0
    assert _scheduled(out) == {"a": 1, "b": 1}
    assert a.status is b.status is GroupStatus.RUNNING


def test_a_swapped_group_that_needs_every_block_comes_back_without_the_watermark():
    sched = _scheduler(8, preemption_mode="swap")
    assert sched.watermark == 1
    a = _group(sched, "a", 120, 1.0)
    _step(sched)  # 120 tokens computed, one more appended: 8 blocks, all of the pool
    sched._preempt(a, SchedulerOutput())
    assert a.status is GroupStatus.SWAPPED and sched.bm.pool.num_free == 8
    out = _step(sched)
    assert _scheduled(out) == {"a": 1} and a.status is GroupStatus.RUNNING


def test_a_swapped_group_that_can_never_step_again_is_recomputed_not_bounced():
    sched = _scheduler(8, preemption_mode="swap")
    a = _group(sched, "a", 128, 1.0)
    _step(sched)  # 128 tokens in 8 blocks: the next one needs a ninth, which does not exist
    out = _step(sched)  # it preempts itself (swapped out)
    assert out.preempted == [a] and a.status is GroupStatus.SWAPPED
    out = _step(sched)  # alone on the device and still no room: recomputed, not swapped again
    assert not out.scheduled and not out.preempted
    assert a.status is GroupStatus.WAITING and list(sched.waiting) == [a]
    assert not sched.swapped and sched.bm.pool.num_free == 8 and sched.bm.cpu_pool.num_used == 0
