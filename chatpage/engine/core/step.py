"""The data one engine step hands from room to room, in a leaf module every room imports alone.

The scheduler's plan (`SchedulerOutput`: which chunks run, which blocks move first) goes to the KV
cache and the model runner; the sampler's picks (`SamplerOutput`) go back to the scheduler, whose
`update_from_output` answers with a `StepResult` (what moved, what failed) for the engine to
report. Only sequences, their groups and torch's generators are named here, so the runner needs
nothing of the scheduler (as vLLM's workers import ``vllm/v1/core/sched/output.py`` alone).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from chatpage.engine.core.sequence import Sequence, SequenceGroup

BlockCopies = list[tuple[int, int]]
"""Block copies the KV cache makes before a forward pass, (source, destination) each."""

BlockLoads = list[tuple[int, torch.Tensor]]
"""Blocks read back from the disk tier, (device block, its bytes) each, written into the pool
before a forward pass."""


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """``num_new_tokens`` of ``seq`` to compute this step. ``samples``: the chunk reaches the
    end of the sequence, so its last position needs logits and a token is picked from them
    (the one place that decides which rows the runner returns and the sampler sees).
    ``draft``: tokens drafted after the decode row (``engine/core/speculate.py``), computed as
    further rows of the chunk (``num_new_tokens`` counts them), each of which samples."""

    group: SequenceGroup
    seq: Sequence
    num_new_tokens: int
    samples: bool
    draft: tuple[int, ...] = ()

    @property
    def logit_rows(self) -> int:
        """How many rows of logits the chunk returns: its last, or every verified one."""
        return len(self.draft) + 1 if self.draft else int(self.samples)


@dataclass
class SchedulerOutput:
    """Everything one step runs: the scheduled chunks, the groups preempted for them, and the
    block copies the KV cache makes before the forward pass, in this order: swap-outs (device
    to CPU), the disk tier's blocks read back (`tier_loads`: into blocks a swap-out may have
    left, so after it), swap-ins (CPU to device), copy-on-write (device to device)."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[SequenceGroup] = field(default_factory=list)
    swap_out: BlockCopies = field(default_factory=list)
    tier_loads: BlockLoads = field(default_factory=list)
    swap_in: BlockCopies = field(default_factory=list)
    copies: BlockCopies = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def sampling(self) -> list[ScheduledSeq]:
        """The chunks that pick a token, in the order of the logits' rows."""
        return [item for item in self.scheduled if item.samples]


@dataclass(frozen=True, slots=True)
class Sample:
    """The token picked for ``seq`` of a plain or n-sample ``group``, its log-probability and
    (when the request asks) the step's most likely tokens. ``fork``: the token starts n-sample
    output ``fork`` on a new sequence forked from ``seq`` (the prefill's one row samples all
    n), drawn with ``generator``, which the fork keeps."""

    group: SequenceGroup
    seq: Sequence
    token: int
    logprob: float
    top: dict[int, float] | None
    fork: int | None = None
    generator: torch.Generator | None = None


@dataclass(frozen=True, slots=True)
class BeamCandidates:
    """A beam group's proposals of one step: the best continuations over its live beams
    ``seqs`` as (beam index, token, new cumulative log-probability), best first, and each
    beam's most likely tokens for a request that asks (per beam, as vLLM). The scheduler's
    beam search chooses among them."""

    group: SequenceGroup
    seqs: tuple[Sequence, ...]
    candidates: tuple[tuple[int, int, float], ...]
    tops: tuple[dict[int, float] | None, ...]


@dataclass
class SamplerOutput:
    """What the sampler picked from one step's logits: plain and n-sample tokens, in row order,
    each beam group's candidates, and the requests whose rows could not be constrained or
    sampled, with why (they get no pick: each fails alone). A drafted sequence has one sample
    per token it keeps (its accepted drafts, then the pick after them), in order, and its count
    of accepted drafts in ``accepted``."""

    samples: list[Sample] = field(default_factory=list)
    beams: list[BeamCandidates] = field(default_factory=list)
    failed: dict[str, Exception] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)  # seq id -> draft tokens kept

    @property
    def num_tokens(self) -> int:
        """Tokens generated this step (every sequence of every request)."""
        return len(self.samples) + sum(len(b.seqs) for b in self.beams)


@dataclass
class StepResult:
    """What `Scheduler.update_from_output` leaves the engine to report: the groups that moved
    (picked a token, or only advanced a prompt chunk), in the order of the sampler's picks, and
    the requests that failed this step (in the sampler or in their own update), with why; a
    failed request is in ``failed`` only."""

    moved: list[SequenceGroup] = field(default_factory=list)
    failed: dict[str, Exception] = field(default_factory=dict)
