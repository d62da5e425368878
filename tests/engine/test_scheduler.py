"""Scheduler over a real BlockManager (no model): token and sequence budgets, chunked prefill,
preemption order, swapped groups that cannot come back as they are, and what the step's picks do
(update_from_output)."""

from __future__ import annotations

import torch

from chatpage.engine.config import EngineConfig
from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.scheduler import Scheduler
from chatpage.engine.core.sequence import GroupStatus, Sequence, SequenceGroup
from chatpage.engine.core.step import Sample, SamplerOutput, SchedulerOutput
from chatpage.engine.core.stop import StopCheck
from chatpage.engine.sampling_params import SamplingParams

BS = 16
EOS = 2


class _Detok:
    def copy(self) -> _Detok:
        return self

    def update(self, token_ids: list[int], final: bool = False) -> bool:
        return False  # no stop strings


def _scheduler(blocks: int, **config) -> Scheduler:
    cfg = EngineConfig(block_size=BS, **config)
    return Scheduler(
        cfg, BlockManager(blocks, 32, BS, enable_caching=False), StopCheck(frozenset({EOS}), 10**6)
    )


def _group(
    sched: Scheduler, rid: str, prompt_len: int, t: float, params: SamplingParams | None = None
) -> SequenceGroup:
    tokens = [7 + i % 50 for i in range(prompt_len)]
    group = SequenceGroup(
        rid,
        tokens,
        params or SamplingParams(temperature=0),
        [Sequence(list(tokens), prompt_len, _Detok())],
        arrival_time=t,
    )
    sched.add(group)
    return group


def _step(sched: Scheduler, token: int = 5) -> SchedulerOutput:
    """A step without a model: schedule, then pick ``token`` for every row that samples."""
    out = sched.schedule()
    picks = SamplerOutput(
        [Sample(item.group, item.seq, token, 0.0, None) for item in out.scheduled if item.samples]
    )
    sched.update_from_output(out, picks)
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


def test_update_appends_the_picks_and_finishes_and_frees_what_ended():
    sched = _scheduler(8)
    a = _group(sched, "a", 20, 1.0)
    b = _group(sched, "b", 20, 2.0, SamplingParams(temperature=0, max_tokens=2))
    _step(sched)
    assert a.seqs[0].output_ids == [5] and b.seqs[0].output_ids == [5]
    assert a.seqs[0].num_computed_tokens == 20 and a.first_token_time is not None
    out = sched.schedule()  # a picks EOS (STOP), b reaches max_tokens (LENGTH)
    moved = sched.update_from_output(
        out,
        SamplerOutput(
            [Sample(a, a.seqs[0], EOS, -0.5, None), Sample(b, b.seqs[0], 6, -0.25, {6: -0.25})]
        ),
    )
    assert moved.moved == [a, b] and not moved.failed
    assert a.seqs[0].finish_reason.value == "stop" and b.seqs[0].finish_reason.value == "length"
    assert b.seqs[0].logprobs == [0.0, -0.25] and b.seqs[0].top_logprobs == [{6: -0.25}]
    assert a.status is b.status is GroupStatus.FINISHED and not sched.running
    assert not sched.bm.tables and sched.bm.pool.num_free == 8


def test_update_forks_each_n_sample_from_the_prefill_as_it_was():
    sched = _scheduler(8)
    group = _group(sched, "n", 20, 1.0, SamplingParams(temperature=1.0, n=2))
    out = sched.schedule()
    first = group.seqs[0]
    generator = torch.Generator()
    sched.update_from_output(
        out,
        SamplerOutput(
            [
                Sample(group, first, 11, -1.0, None),
                Sample(group, first, 12, -2.0, None, 1, generator),
            ]
        ),
    )
    parent, child = group.seqs
    assert (parent.output_ids, child.output_ids) == ([11], [12])
    assert (child.index, child.generator, child.logprobs) == (1, generator, [-2.0])
    assert child.num_computed_tokens == 20 and group.forked
    # the prompt's blocks are shared, not copied
    assert sched.bm.tables[parent.seq_id] == sched.bm.tables[child.seq_id]


def test_a_finished_persona_prefix_is_pinned_before_its_blocks_are_freed():
    sched = _scheduler(8)
    group = _group(sched, "p", 40, 1.0, SamplingParams(temperature=0, max_tokens=1))
    group.pin_prefix = True
    _step(sched)
    assert group.status is GroupStatus.FINISHED and not sched.bm.tables
    assert sched.bm.pool.num_pinned == 2  # the prompt's two full blocks


class _BrokenMatcher:
    def advance(self, token: int) -> None:
        raise RuntimeError("the grammar broke")


def test_a_group_whose_update_raises_fails_alone():
    sched = _scheduler(8)
    a = _group(sched, "a", 20, 1.0)
    b = _group(sched, "b", 20, 2.0)
    a.seqs[0].matcher = _BrokenMatcher()  # type: ignore[assignment]
    out = sched.schedule()
    result = sched.update_from_output(
        out, SamplerOutput([Sample(a, a.seqs[0], 5, 0.0, None), Sample(b, b.seqs[0], 6, 0.0, None)])
    )
    assert result.moved == [b] and list(result.failed) == ["a"]
    assert str(result.failed["a"]) == "the grammar broke"
    assert b.seqs[0].output_ids == [6] and b.status is GroupStatus.RUNNING
    sched.remove(a)  # (the engine ends a failed request)
    assert not sched.bm.audit() and list(sched.bm.tables) == [b.seqs[0].seq_id]
