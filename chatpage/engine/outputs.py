"""What the engine reports: one `RequestUpdate` per request per step (deltas), the finished
`RequestOutput` they fold into (`chatpage.engine.accumulator`), EngineStats and the token rate."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from chatpage.vocab import FinishReason


def new_call_id() -> str:
    """A fresh id for a tool call (OpenAI's shape)."""
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """What call ``index`` of an output gained in one step (OpenAI's streamed shape): its
    first delta carries the call's ``id`` and ``name``, later ones pieces of its arguments'
    JSON text (a first delta may carry a piece too)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class CompletionOutput:
    """One output of a request: a plain reply, one of n samples, or one beam (best first)."""

    index: int
    token_ids: list[int]
    text: str
    cumulative_logprob: float
    finish_reason: FinishReason | None = None
    logprobs: list[float] | None = None  # per token, when SamplingParams.logprobs is set
    score: float | None = None  # beam search: length-penalized score
    top_logprobs: list[dict[int, float]] | None = None  # per token: the SamplingParams.logprobs
    # most likely token ids -> log-probability, best first (when that is > 0)
    num_tokens: int = 0  # generated tokens (len(token_ids) where the ids are known)
    reasoning: str = ""  # the model's thinking, split out of ``text``
    tool_calls: list[ToolCall] = field(default_factory=list)  # the calls it made (not in
    # ``text``), when the request offered tools


@dataclass
class RequestOutput:
    """A request's outputs so far, folded from its updates; complete once ``finished``."""

    request_id: str
    outputs: list[CompletionOutput]
    finished: bool
    usage: Usage
    ttft_s: float | None = None  # arrival to first generated token
    elapsed_s: float = 0.0
    error: str | None = None


@dataclass(frozen=True, slots=True)
class OutputDelta:
    """What one output of a request gained in one step: its new text (from the detokenizer's
    own delta), new token ids and their logprobs, its thinking and tool calls split out of the
    text, and its finish reason once it ended.

    With ``rewrite`` the fields are the output's whole text, tokens and calls so far,
    replacing what came before (beam search reorders its beams); otherwise they are appended
    to it."""

    index: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None  # when SamplingParams.logprobs is set
    top_logprobs: tuple[dict[int, float], ...] | None = None  # per new token, when asked
    finish_reason: FinishReason | None = None
    cumulative_logprob: float = 0.0  # of the whole output so far
    score: float | None = None  # beam search: the length-penalized score
    rewrite: bool = False
    num_tokens: int = 0  # new tokens: len(token_ids), or a count where a server names no ids
    reasoning: str = ""  # new thinking (the model's, between its markers; not in ``text``)
    tool_calls: tuple[ToolCallDelta, ...] = ()  # its tool calls' progress (not in ``text``)


@dataclass(frozen=True, slots=True)
class Usage:
    """A request's token counts so far."""

    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache
    completion_tokens: int = 0  # over every output
    prefilled_tokens: int = 0  # prompt tokens in the cache so far (cached ones included): a
    # long prompt prefills in chunks, and an update comes after each
    disk_tokens: int = 0  # of cached_tokens, those read from the disk tier
    draft_tokens: int = 0  # tokens speculative decoding drafted (engine/core/speculate.py)
    accepted_tokens: int = 0  # of which the verification kept


@dataclass(frozen=True, slots=True)
class RequestUpdate:
    """One update per request per step: the outputs that changed, the usage, and at the end
    ``finished`` (every output has its finish reason) or ``error`` (the request failed: every
    output ends with FinishReason.ERROR)."""

    request_id: str
    outputs: tuple[OutputDelta, ...]
    usage: Usage
    finished: bool = False
    error: str | None = None
    ttft_s: float | None = None  # submit to first generated token
    elapsed_s: float = 0.0  # since submit


def final_update(
    request_id: str,
    reason: FinishReason,
    indices: Iterable[int] = (0,),
    error: str | None = None,
    usage: Usage | None = None,
    ttft_s: float | None = None,
    elapsed_s: float = 0.0,
) -> RequestUpdate:
    """The last update of a request, bringing no new text: each output in ``indices`` ends with
    ``reason`` (ABORT: cancelled; ERROR: failed, ``error`` says why)."""
    return RequestUpdate(
        request_id,
        tuple(OutputDelta(i, finish_reason=reason) for i in indices),
        usage or Usage(),
        finished=True,
        error=error,
        ttft_s=ttft_s,
        elapsed_s=elapsed_s,
    )


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the block pool and the queues (the UI's gauge shows these numbers)."""

    num_blocks: int
    block_size: int
    bytes_per_block: int
    blocks_used: int  # ref count > 0, pinned included
    blocks_shared: int  # ref count > 1 (a pinned prefix block read by a chat counts)
    blocks_private: int  # ref count 1 and not pinned: used = private + pinned + shared unpinned
    blocks_cached: int  # ref count 0, still indexed by hash
    blocks_pinned: int
    blocks_free: int
    num_cpu_blocks: int
    blocks_swapped: int  # in use in the CPU swap pool
    num_running: int
    num_waiting: int
    num_swapped: int
    prefix_hit_tokens: int
    preemptions_recompute: int
    preemptions_swap: int
    evictions: int
    logical_blocks: int  # sum of the device block-table lengths
    tokens_per_s: float
    kernels: str = "reference"
    device: str = "cpu"  # where the engine runs (and its KV pool lives): "cpu", "cuda:0", ...
    # the disk tier under the pool (engine/core/kv_tiers.py; capacity 0: none)
    disk_capacity: int = 0  # its bound in bytes, over every model's blocks
    disk_bytes: int = 0  # what its folder holds
    disk_blocks: int = 0  # this model's blocks in it
    disk_hit_tokens: int = 0  # of prefix_hit_tokens, those read from it
    disk_writes: int = 0  # blocks written
    # speculative decoding since the engine started: verifications, tokens drafted, kept
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def segments(self) -> dict[str, int]:
        """The device pool split in parts that add up to ``num_blocks``: pinned, shared
        (unpinned blocks read by several sequences), private, cached and free."""
        pinned, private = self.blocks_pinned, self.blocks_private
        return {
            "pinned": pinned,
            "shared": self.blocks_used - pinned - private,
            "private": private,
            "cached": self.blocks_cached,
            "free": self.blocks_free,
        }

    @property
    def sharing_saving(self) -> float:
        """1 - physical / logical: the share of block-table entries served by shared blocks."""
        if not self.logical_blocks:
            return 0.0
        return 1.0 - (self.blocks_used - self.blocks_pinned) / self.logical_blocks


class TokenRate:
    """Generated tokens: the total, and the rate over the last ``window_s`` seconds."""

    def __init__(self, window_s: float = 3.0) -> None:
        self.window_s = window_s
        self.total = 0
        self._recent: deque[tuple[float, int]] = deque()

    def add(self, now: float, n: int) -> None:
        """``n`` tokens came out at time ``now`` (time.monotonic())."""
        self.total += n
        self._recent.append((now, n))
        while self._recent and now - self._recent[0][0] > self.window_s:
            self._recent.popleft()

    def per_s(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1][0] - self._recent[0][0]
        return sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0
