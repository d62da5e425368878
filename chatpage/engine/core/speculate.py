"""Draftless speculative decoding: drafts from n-gram lookup, verified in the batched step.

A sequence's draft is what followed the earlier occurrence of its last few tokens (the longest
of `NGRAM_MAX` down to `NGRAM_MIN` that occurred) that the most of its context before them
matches (`NgramIndex.longest`: a suffix match), in its request's draft sources (the other
versions of a chat turn: the reply a regenerate or an edit replaces,
`SamplingParams.draft_source`), the other samples of its request (n > 1) and its own prompt and
output: prompt lookup, as vLLM's n-gram proposer and llama.cpp's lookup do, with no draft model.
Under a grammar (structured output), the tokens the grammar forces from where the sequence is
(llguidance's fast-forward tokens: a JSON schema's keys and punctuation) are the draft, kept
with certainty; any other draft is cut where the grammar stops allowing it, and each drafted
row is masked as the grammar stands after the drafts before it (`step_sampler.Sampler._verify`).
A regenerate repeats the reply it replaces token for token (`Scheduler._tail_apart`), so that
reply drafts it whole. The scheduler adds the drafted tokens as extra query rows of the
sequence's decode row (`ScheduledSeq.draft`); the sampler picks
a token from every row and keeps the drafts that equal the picks, plus the pick after the last
kept one; the rejected rows' KV is rolled back (the computed-token count, the blocks past it),
never indexed in the prefix cache.

Exact: a verified row's logits are bitwise those of the decode step that row would have run
alone, because every kernel computes a row alike whatever the other rows of a step of at most
`LlamaModel.exact_rows` rows (csrc/cpu/attention.cpp's row-by-row sequences, one matmul kernel
up to that many rows: `engine/model/weights.py`'s q8_pack_rows); so a step is drafted only while
it stays within them, and greedy output is the same with and without speculation.

Switched off where it does not pay: per sequence the draft length adapts to its recent
acceptance (`SpecState`; a source aligned with the whole output, or a long match, is trusted
more) and to what a
drafted row costs beside the step (`step_cost`,
`row_cost`: the matmuls' rows and the attention over the context, measured), and per step
`Speculator.plan` keeps drafts only while the step's expected tokens per unit of time beat the
plain step's. Sampled requests keep their distribution by speculative
sampling (`engine/sample/sampler.py`'s `speculative_picks`). Beam search is not speculated: its
step picks among every beam's continuations at once, so a beam cannot run ahead of the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from weakref import WeakKeyDictionary

from chatpage.engine.core.sequence import Sequence, SequenceGroup
from chatpage.engine.text.grammar import GrammarMatcher

NGRAM_MAX = 4
"""The longest suffix looked up (a longer match predicts better; vLLM's default maximum is 5)."""
NGRAM_MIN = 2
"""The shortest: a single token recurs too often to predict what follows it."""
MATCH_MAX = 64
"""The most of a context compared with an occurrence of its last n-gram (enough to tell the
lines of a file apart)."""
MAX_DRAFT = 15
"""The most tokens drafted for one sequence: 16 query rows, what the CPU attention runs row by
row (csrc/cpu/attention.cpp's kRowByRow)."""
STEP_ROW_COST = 0.12
"""What one more sequence's decode row adds to a plain step, as a fraction of a plain batch-1
decode step of the default model at no context (int4 on an AVX-512 AMX CPU, 1 thread, forward
only: 1 row 10.9 ms at 300 tokens of context, 2 rows 1.12x, 4 1.32x, 8 1.86x, 16 2.91x)."""
DRAFT_ROW_COST = 0.25
"""What a drafted row adds to a step beside its attention, in the same unit: its matmul row, its
lm_head row (a plain step computes logits for its sampling rows only) and its verification's
picks; measured by `bench spec` (a greedy regenerate, every draft kept: 2.98x in 17 steps of
178 drafts at batch 1; drafts at 70-80% acceptance at batch 8 ran 0.88-0.90x of plain steps
with STEP_ROW_COST here, as the matmuls alone cost)."""
KEY_COST = 1.0e-3
"""What a decode row's attention adds per key of its context, in the same unit (a plain step
of the default model at 2,442 tokens of context took 3.5 times one at 44)."""
DRAFT_KEY_COST = 3.4e-4
"""What a drafted row's attention adds per key: less than a decode row's, the rows of a
verification sharing each block they read (csrc/cpu/attention.cpp; a verification of 15
drafts at 2,442 tokens took 5.7 plain steps there)."""
START_RATE = 0.5
"""A sequence's assumed acceptance before its first verification, and after a draft it did
not keep whole."""
HOT_RATE = 0.8
"""Its assumed acceptance after a draft it kept whole, before it learns its own: copying runs
on (a file sent back, a quote), so it is measured apart (`SpecState.rates`)."""
ALIGNED_RATE = 0.9
"""The acceptance assumed at least for a draft source that starts with the whole output so far
(a greedy regenerate repeats the reply it replaces token for token)."""
LONG_MATCH = 8
"""A sequence's first lookup whose match is at least this long (the context's last tokens found
in order) is trusted as a draft kept whole is (`HOT_RATE` at least): a line of a file or a
quote; its own acceptance decides from its first verification on."""
RATE_MEMORY = 0.8
"""How much of its acceptance estimate a sequence keeps per token verified (an EMA over the
kept tokens and the first rejected one: the tokens after it say nothing)."""


class NgramIndex:
    """Where each n-gram (`NGRAM_MIN`..`NGRAM_MAX` tokens) of a token list ended, for the ones
    some token follows, in order; extended as the list grows. `longest` finds, among the
    occurrences of a context's last n tokens, the one that matches the most of the context
    before them: a suffix match, so a file copied back drafts from the line it is at, not from
    the latest line that starts alike."""

    def __init__(self, tokens: list[int], start: int = 0) -> None:
        self.tokens = tokens  # (the sequence's own list: it grows in place)
        self.ends: dict[tuple[int, ...], list[int]] = {}
        # n-grams ending before this position are in ``ends`` (or not wanted: those ending
        # before ``start - 1``, a sibling sample's prompt, which the sequence's own index has)
        self.indexed = max(0, start - 1)
        self.extend()

    def extend(self) -> None:
        """Index the n-grams ending at every position that a token now follows."""
        toks = self.tokens
        for end in range(self.indexed, len(toks) - 1):
            for n in range(NGRAM_MIN, NGRAM_MAX + 1):
                if end + 1 >= n:
                    self.ends.setdefault(tuple(toks[end + 1 - n : end + 1]), []).append(end)
        self.indexed = max(self.indexed, len(toks) - 1)

    def longest(self, context: list[int], n: int) -> tuple[int, int]:
        """(length, end): the occurrence of ``context``'s last ``n`` tokens that the most of
        ``context`` ends at (up to `MATCH_MAX` tokens; the latest of equals), and how much;
        (0, -1) where they never occurred."""
        toks = self.tokens
        best, best_end = 0, -1
        for end in reversed(self.ends.get(tuple(context[-n:]), ())):
            length = n
            limit = min(MATCH_MAX, end + 1, len(context))
            while length < limit and toks[end - length] == context[-1 - length]:
                length += 1
            if length > best:
                best, best_end = length, end
                if length == MATCH_MAX:
                    break
        return best, best_end


@dataclass
class SpecState:
    """One sequence's speculation: its lookup indexes (its own, its request's draft sources, its
    sibling samples': `peers`) and its acceptance estimate."""

    own: NgramIndex
    sources: list[NgramIndex] = field(default_factory=list)
    peers: list[NgramIndex] = field(default_factory=list)
    # the acceptance estimates after a draft not kept whole (or none yet) and after one kept
    # whole, and which applies now
    rates: list[float] = field(default_factory=lambda: [START_RATE, HOT_RATE])
    hot: bool = False

    @property
    def rate(self) -> float:
        """The acceptance estimate of the next draft's tokens."""
        return self.rates[self.hot]

    def draft(self, tokens: list[int], count: int, output: int) -> tuple[list[int], float]:
        """Up to ``count`` tokens that may follow ``tokens``, whose last ``output`` are the
        sequence's output, and the acceptance they are trusted with at least: a source that
        starts with the whole output goes on from there (a regenerated reply that repeats the
        one it replaces: `ALIGNED_RATE`); else what follows the longest match of the tokens'
        end (`NgramIndex.longest`; `HOT_RATE` from `LONG_MATCH` tokens), in the sources, the
        peers or the sequence itself, in that order of equals."""
        said = tokens[len(tokens) - output :]
        for index in self.sources:
            if output and index.tokens[:output] == said and len(index.tokens) > output:
                return index.tokens[output : output + count], ALIGNED_RATE
        for index in (*self.peers, self.own):
            index.extend()
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            if len(tokens) < n:
                continue
            found: tuple[int, int, NgramIndex | None] = (0, -1, None)
            for index in (*self.sources, *self.peers, self.own):
                length, end = index.longest(tokens, n)
                if length > found[0]:
                    found = (length, end, index)
            matched, end, best = found
            if best is not None:
                trusted = HOT_RATE if matched >= LONG_MATCH else 0.0
                return best.tokens[end + 1 : end + 1 + count], trusted
        return [], 0.0

    def verified(self, drafted: int, accepted: int) -> None:
        rate = 1 - (1 - self.rate) * RATE_MEMORY**accepted
        self.rates[self.hot] = rate if accepted == drafted else rate * RATE_MEMORY
        self.hot = accepted == drafted


def grammar_draft(
    matcher: GrammarMatcher | None,
    lookup: Callable[[], tuple[list[int], float]],
    count: int,
) -> tuple[list[int], float]:
    """A draft and the acceptance it is trusted with: under a grammar, the tokens it forces from
    here (up to ``count``, kept with certainty), else ``lookup()``'s draft cut where the
    grammar stops allowing it; without one, ``lookup()``'s (the n-gram lookup is not run where
    the grammar decides)."""
    forced = matcher.forced()[:count] if matcher is not None else []
    if forced:
        return forced, 1.0
    draft, trusted = lookup()
    if matcher is not None:
        draft = draft[: matcher.valid_prefix(draft)]
    return draft, trusted


def draft_length(rate: float, tokens: int, cost: float, row: float) -> int:
    """The draft length that makes the most tokens per unit of time of a step that makes
    ``tokens`` tokens in time ``cost`` undrafted, each drafted row costing ``row``, its tokens
    each kept with probability ``rate`` (0: drafting does not pay)."""
    best, best_rate, expected, term = 0, tokens / cost, 0.0, 1.0
    for k in range(1, MAX_DRAFT + 1):
        term *= rate
        expected += term  # expected_accepted(rate, k)
        per_time = (tokens + expected) / (cost + row * k)
        if per_time > best_rate:
            best, best_rate = k, per_time
    return best


def step_cost(contexts: list[int]) -> float:
    """What a plain decode step of rows with these contexts costs, in plain batch-1 steps at no
    context."""
    return 1 + STEP_ROW_COST * (len(contexts) - 1) + KEY_COST * sum(contexts)


def row_cost(context: int) -> float:
    """What a drafted row of a sequence with ``context`` tokens adds to a step."""
    return DRAFT_ROW_COST + DRAFT_KEY_COST * context


def expected_accepted(rate: float, k: int) -> float:
    """Expected accepted tokens of a k-token draft whose tokens each pass with ``rate`` (until
    the first that fails)."""
    return sum(rate**i for i in range(1, k + 1))


def speculates(group: SequenceGroup) -> bool:
    """Whether ``group`` may draft: asked for, not beam search, and (n samples) widened to its
    samples (a sampled request's drafts are verified by speculative sampling,
    `sample.sampler.speculative_picks`)."""
    p = group.params
    return p.speculate and not p.use_beam_search and (p.n == 1 or group.forked)


class Speculator:
    """Drafts for a step's decode rows, within ``exact_rows`` rows a step (see the module)."""

    def __init__(self, exact_rows: int, max_draft: int = MAX_DRAFT) -> None:
        self.exact_rows = exact_rows
        self.max_draft = min(max_draft, MAX_DRAFT, exact_rows - 1)
        self.drafts = 0  # every request's verifications, tokens drafted and kept, since the
        self.drafted = 0  # engine started
        self.accepted = 0
        # each drafting sequence's state, for as long as the sequence lives
        self.states: WeakKeyDictionary[Sequence, SpecState] = WeakKeyDictionary()

    @property
    def enabled(self) -> bool:
        return self.max_draft > 0

    def state(self, group: SequenceGroup, seq: Sequence) -> SpecState:
        state = self.states.get(seq)
        if state is None:
            sources = [NgramIndex(list(s)) for s in group.params.draft_source if s]
            peers = [NgramIndex(s.token_ids, s.prompt_len) for s in group.seqs if s is not seq]
            state = self.states[seq] = SpecState(NgramIndex(seq.token_ids), sources, peers)
        return state

    def verified(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """``seq`` had ``accepted`` of its ``drafted`` tokens kept."""
        self.states[seq].verified(drafted, accepted)
        seq.drafted += drafted
        seq.accepted += accepted
        self.drafts += 1
        self.drafted += drafted
        self.accepted += accepted

    def plan(self, rows: list[tuple[SequenceGroup, Sequence]], room: int) -> list[list[int]]:
        """Drafts for decode rows ``rows`` (one each) of a step with ``room`` rows to spare
        within the exact ones; each as long as makes the most tokens per unit of time of the
        step, and kept only while the step's expected tokens per unit of
        time beat the plain step's (`draft_length`, `step_cost`, `row_cost`)."""
        drafts: list[list[int]] = [[] for _ in rows]
        room = min(room, self.exact_rows - len(rows))
        plain = step_cost([len(seq) for _, seq in rows])
        wanted = []
        for i, (group, seq) in enumerate(rows):
            if room <= 0 or not speculates(group):
                continue
            state = self.state(group, seq)
            left = min(self.max_draft, room, self._left(group, seq))
            lookup = partial(self._lookup, state, seq, left)
            draft, trusted = grammar_draft(seq.matcher, lookup, left)
            rate = max(state.rate, trusted)
            draft = draft[: draft_length(rate, len(rows), plain, row_cost(len(seq)))]
            if draft:
                drafts[i] = draft
                room -= len(draft)
                wanted.append((expected_accepted(rate, len(draft)), i))
        # drop the least promising drafts while they cost more than they bring
        wanted.sort()
        while wanted:
            gain = sum(e for e, _ in wanted)
            extra = sum(row_cost(len(rows[i][1])) * len(drafts[i]) for _, i in wanted)
            if (len(rows) + gain) / (plain + extra) > len(rows) / plain:
                break
            drafts[wanted.pop(0)[1]] = []
        return drafts

    @staticmethod
    def _lookup(state: SpecState, seq: Sequence, count: int) -> tuple[list[int], float]:
        """``seq``'s n-gram draft of up to ``count`` tokens (`SpecState.draft`); a long match is
        trusted only until the sequence has its own acceptance rate."""
        draft, trusted = state.draft(seq.token_ids, count, seq.num_output_tokens)
        return draft, (0.0 if seq.drafted and trusted < ALIGNED_RATE else trusted)

    @staticmethod
    def _left(group: SequenceGroup, seq: Sequence) -> int:
        """Drafted tokens past ``max_tokens`` could never be kept."""
        return group.params.max_tokens - seq.num_output_tokens - 1
