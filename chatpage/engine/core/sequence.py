"""Sequence and SequenceGroup: one request is a group of 1 sequence, n samples, or a beam group."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.text.detokenizer import IncrementalDetokenizer
from chatpage.vocab import FinishReason

if TYPE_CHECKING:
    from chatpage.engine.text.grammar import GrammarMatcher
    from chatpage.engine.text.reasoning import ThinkSplitter
    from chatpage.engine.text.tool_calls import ToolCallParser


class GroupStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


_seq_ids = itertools.count()


class Sequence:
    """One token stream: the prompt, its generated tokens, and how much of it is in the KV cache."""

    def __init__(
        self,
        token_ids: list[int],
        prompt_len: int,
        detok: IncrementalDetokenizer,
        index: int = 0,
    ) -> None:
        self.seq_id: int = next(_seq_ids)
        self.index = index  # the output index within its group
        self.token_ids: list[int] = token_ids
        self.prompt_len = prompt_len
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.cumulative_logprob = 0.0
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float]] = []  # per token, when the request asks
        self.finish_reason: FinishReason | None = None
        self.detok = detok
        self.generator: torch.Generator | None = None
        self.num_reported = 0  # output tokens already sent in a RequestUpdate
        self.end_reported = False  # its finish reason has been sent
        self.matcher: GrammarMatcher | None = None  # its place in the request's grammar
        self.thinking: ThinkSplitter | None = None  # splits its text into thinking and answer
        self.tools: ToolCallParser | None = None  # reads the answer's tool calls
        # the chain hashes of its full blocks, extended by the block manager as they fill
        self.block_hashes: list[bytes] = []
        self.drafted = 0  # tokens speculative decoding drafted for it, and of them kept
        self.accepted = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.prompt_len :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    def append(self, token_id: int, logprob: float, top: dict[int, float] | None = None) -> None:
        """Add a generated token, its log-probability and (if asked for) the step's most
        likely tokens'. The grammar (if any) moves on with it."""
        if self.matcher is not None:
            self.matcher.advance(token_id)
        self.token_ids.append(token_id)
        self.cumulative_logprob += logprob
        self.logprobs.append(logprob)
        if top is not None:
            self.top_logprobs.append(top)

    def fork(self) -> Sequence:
        """A copy with a new id; the caller forks the block table alongside."""
        child = Sequence(list(self.token_ids), self.prompt_len, self.detok.copy(), self.index)
        child.num_computed_tokens = self.num_computed_tokens
        child.cumulative_logprob = self.cumulative_logprob
        child.logprobs = list(self.logprobs)
        child.top_logprobs = list(self.top_logprobs)
        child.num_reported = self.num_reported
        child.block_hashes = list(self.block_hashes)
        child.matcher = self.matcher.fork() if self.matcher is not None else None
        child.thinking = self.thinking.copy() if self.thinking is not None else None
        child.tools = self.tools.copy() if self.tools is not None else None
        return child


@dataclass
class BeamHypothesis:
    """A finished beam, kept aside until the search ends."""

    token_ids: list[int]  # generated tokens only
    cumulative_logprob: float
    score: float
    text: str
    finish_reason: FinishReason
    logprobs: list[float] = field(default_factory=list)  # per token
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # per token, if asked


@dataclass
class SequenceGroup:
    """One request: its sequences, sampling parameters and timing."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    seqs: list[Sequence]
    arrival_time: float = field(default_factory=time.monotonic)
    status: GroupStatus = GroupStatus.WAITING
    prefix_hit_tokens: int = 0
    disk_hit_tokens: int = 0  # of prefix_hit_tokens, those read from the disk tier
    first_token_time: float | None = None
    finish_time: float | None = None
    pin_prefix: bool = False  # a persona prefix: pin its full blocks when it finishes
    beam_hypotheses: list[BeamHypothesis] = field(default_factory=list)
    started: bool = False  # has been scheduled at least once (prefix hits counted then)
    thinking: ThinkSplitter | None = None  # how a reply of it starts: split whole texts with it
    tools: ToolCallParser | None = None  # a fresh parser of its replies' tool calls (the
    # request offers tools): read whole texts with a copy

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.finished]

    @property
    def is_multi(self) -> bool:
        """Several sequences share this group's blocks (n samples or beams) or will."""
        return self.params.width > 1

    def fork(self, parent: Sequence, index: int) -> Sequence:
        """A new sequence of this group continuing ``parent`` as output ``index`` (the caller
        forks the block table alongside)."""
        child = parent.fork()
        child.index = index
        self.seqs.append(child)
        return child

    @property
    def forked(self) -> bool:
        """The prompt is prefilled and the group has been widened to its n samples / beams."""
        return len(self.seqs) > 1 or self.seqs[0].num_output_tokens > 0
