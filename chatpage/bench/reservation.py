"""Contiguous-reservation baselines (the paper's Orca variants), for the memory and serve benches.

Orca-style systems reserve one contiguous slab of KV slots per request when it is admitted:

* Max: the longest sequence the system allows (the paper's 2048, scaled with the trace),
* Pow2: the next power of two of the request's final length,
* Oracle: exactly the request's final length (prompt + true output).

:func:`simulate` replays a trace through iteration-level FCFS scheduling under a KV budget at the
token level: a request is admitted when a first-fit hole of its reservation exists in the budget's
address space; once admitted it prefills its prompt, then adds one token per iteration. With EOS
ignored and fixed output lengths, the memory accounting needs no model.

:class:`ReservationScheduler` is the engine-side Oracle for the serve bench: chatpage's own
scheduler, except that a waiting request is only offered for admission when its whole reservation
(prompt + true output, in blocks) fits next to the reservations of those already admitted. It never
changes how the engine runs what it admitted.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from chatpage.bench.workloads import BenchRequest
from chatpage.engine.core.scheduler import Scheduler
from chatpage.engine.core.step import SchedulerOutput

POLICIES = ("max", "pow2", "oracle")


def reservation(policy: str, request: BenchRequest, max_len: int) -> int:
    """Slots a ``policy`` reserves for ``request``."""
    total = request.total_len
    if policy == "max":
        return max(max_len, total)
    if policy == "pow2":
        return 1 << (total - 1).bit_length()
    if policy == "oracle":
        return total
    raise ValueError(f"unknown reservation policy {policy!r}; choose one of {POLICIES}")


class _Slabs:
    """First-fit allocation of contiguous slabs in ``[0, size)``; holes merge on free."""

    def __init__(self, size: int) -> None:
        self.holes: list[tuple[int, int]] = [(0, size)]  # (start, length), sorted by start

    @property
    def free(self) -> int:
        return sum(n for _, n in self.holes)

    def allocate(self, n: int) -> int | None:
        for i, (start, length) in enumerate(self.holes):
            if length >= n:
                if length == n:
                    del self.holes[i]
                else:
                    self.holes[i] = (start + n, length - n)
                return start
        return None

    def release(self, start: int, n: int) -> None:
        self.holes.append((start, n))
        self.holes.sort()
        merged: list[tuple[int, int]] = []
        for s, length in self.holes:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self.holes = merged


@dataclass
class _Running:
    request: BenchRequest
    start: int
    size: int
    generated: int = 0


@dataclass
class SimResult:
    utilization: float  # time-averaged live tokens / (reserved + externally fragmented)
    mean_batch: float
    max_batch: int
    iterations: int
    reserved_share: float  # time-averaged share of reserved-but-unused slots
    external_share: float  # time-averaged share lost to external fragmentation


def simulate(
    trace: list[BenchRequest],
    policy: str,
    budget_tokens: int,
    *,
    max_len: int,
    max_num_seqs: int = 128,
    max_num_batched_tokens: int = 1024,
) -> SimResult:
    """Replay ``trace`` (all requests waiting at the start) under ``policy`` reservations."""
    slabs = _Slabs(budget_tokens)
    waiting = deque(trace)
    running: list[_Running] = []
    util: list[float] = []
    unused: list[float] = []
    external: list[float] = []
    batches: list[int] = []
    for r in trace:
        if reservation(policy, r, max_len) > budget_tokens:
            raise ValueError(
                f"a request needs {reservation(policy, r, max_len)} slots under "
                f"{policy} but the budget is {budget_tokens}"
            )
    while waiting or running:
        # admission: strictly FCFS; a prompt is prefilled in the iteration that admits it
        tokens = len(running)  # one decode token each
        blocked_need = 0
        while waiting and len(running) < max_num_seqs:
            head = waiting[0]
            if running and tokens + head.prompt_len > max_num_batched_tokens:
                break
            size = reservation(policy, head, max_len)
            start = slabs.allocate(size)
            if start is None:
                blocked_need = size
                break
            waiting.popleft()
            running.append(_Running(head, start, size))
            tokens += head.prompt_len
        for run in running:
            run.generated += 1
        batches.append(len(running))
        done = [run for run in running if run.generated >= run.request.output_len]
        for run in done:
            running.remove(run)
            slabs.release(run.start, run.size)
        live = sum(run.request.prompt_len + run.generated - 1 for run in running)
        reserved = sum(run.size for run in running)
        # free space that would fit the blocked head in total, but not in one piece
        frag = slabs.free if blocked_need and slabs.free >= blocked_need else 0
        if reserved:
            util.append(live / (reserved + frag))
            unused.append((reserved - live) / (reserved + frag))
            external.append(frag / (reserved + frag))
    n = len(util) or 1
    return SimResult(
        utilization=sum(util) / n,
        mean_batch=sum(batches) / len(batches),
        max_batch=max(batches),
        iterations=len(batches),
        reserved_share=sum(unused) / n,
        external_share=sum(external) / n,
    )


class ReservationScheduler(Scheduler):
    """chatpage's scheduler with Oracle admission: a waiting group is admissible only when its
    reservation (``reservations[request_id]`` tokens, in blocks) fits beside the reservations of
    the groups already admitted. Requests missing from ``reservations`` reserve prompt +
    max_tokens."""

    def __init__(self, config, block_manager, stop, reservations: dict[str, int]) -> None:
        super().__init__(config, block_manager, stop)
        self.reservations = reservations

    def _blocks(self, group) -> int:
        # a request without a known output length reserves for its max_tokens
        tokens = self.reservations.get(group.request_id, group.prompt_len + group.params.max_tokens)
        return -(-tokens // self.bm.block_size)

    def schedule(self) -> SchedulerOutput:
        held = list(self.running) + list(self.swapped)
        room = self.bm.pool.num_blocks - self.bm.pool.num_pinned - sum(map(self._blocks, held))
        admissible: deque = deque()
        queue = list(self.waiting)
        for group in queue:
            need = self._blocks(group)
            if need > room:
                break
            admissible.append(group)
            room -= need
        rest = queue[len(admissible) :]
        self.waiting = admissible
        try:
            return super().schedule()
        finally:
            self.waiting = deque(list(self.waiting) + rest)
