"""The engine's sampler: one step's logits in, its `SamplerOutput` out (as vLLM's ``Sampler``).

Every row that samples is first constrained (its logit bias, its grammar's mask), then plain and
n-sample rows are drawn in one `sample` call and each beam group's rows propose its best
continuations, which the scheduler's beam search chooses among. A request whose rows cannot be
constrained, drawn or proposed for fails alone: it gets no pick and is named in
`SamplerOutput.failed`, and every other row is sampled as ever.
"""

from __future__ import annotations

import torch

from chatpage.engine.core.sequence import Sequence, SequenceGroup
from chatpage.engine.core.step import BeamCandidates, Sample, SamplerOutput, ScheduledSeq
from chatpage.engine.sample.constraints import LogitConstraints
from chatpage.engine.sample.sampler import (
    beam_candidates,
    make_generator,
    sample,
    speculative_picks,
    top_logprobs,
)
from chatpage.engine.text.grammar import GrammarMatcher

_Target = tuple[SequenceGroup, Sequence, int, int | None, torch.Generator | None]
"""A row to draw: (group, sequence, logits row, the n-sample fork it starts or None, generator)."""


class Sampler:
    """Picks a step's tokens on ``device`` (where new n-sample forks' generators live), after
    ``constraints`` (the engine's, whose mask timings a benchmark reads)."""

    def __init__(self, constraints: LogitConstraints, device: torch.device) -> None:
        self.constraints = constraints
        self.device = device

    def __call__(self, sampling: list[ScheduledSeq], logits: torch.Tensor) -> SamplerOutput:
        """The picks of ``logits`` (in the order of ``sampling``, ``logit_rows`` rows each)."""
        out = SamplerOutput()
        if not any(item.draft for item in sampling):
            self._rows(sampling, logits, out)
            return out
        plain: list[ScheduledSeq] = []
        plain_rows: list[int] = []
        at = 0
        for item in sampling:
            if item.draft:
                self._verify(item, logits[at : at + item.logit_rows], out)
            else:
                plain.append(item)
                plain_rows.append(at)
            at += item.logit_rows
        if plain:
            self._rows(plain, logits[torch.tensor(plain_rows, device=logits.device)], out)
        return out

    def _verify(self, item: ScheduledSeq, logits: torch.Tensor, out: SamplerOutput) -> None:
        """A drafted sequence's picks (``engine/core/speculate.py``): greedy, a token from each
        of its rows as its plain row would pick it, the drafts that equal the picks before them
        kept and the pick after the last kept one; sampled, by speculative sampling
        (`speculative_picks`). Each row is first constrained as a plain row there would be: its
        logit bias, and its grammar's mask where the grammar stands after the drafts before it
        (the scheduler drafts only tokens the grammar allows)."""
        group, seq, draft = item.group, item.seq, item.draft
        rid, n = group.request_id, len(draft) + 1
        if group.params.logit_bias or seq.matcher is not None:
            # the grammar after each draft token (a grammar ended by one leaves the rows after
            # it unmasked: the sequence stops there, and their picks go unused)
            matchers: list[GrammarMatcher | None] = [seq.matcher] + [None] * len(draft)
            for i, token in enumerate(draft):
                before = matchers[i]
                if before is None:
                    break
                ahead = before.fork()
                ahead.advance(token)
                matchers[i + 1] = None if ahead.done else ahead
            rows = [(row, group.params, matchers[row]) for row in range(n)]
            for error in self.constraints.apply(logits, rows).values():
                out.failed.setdefault(rid, error)
                return
        if not group.params.greedy:
            try:
                picked, kept = speculative_picks(logits, draft, group.params, seq.generator)
            except Exception as e:  # (a distribution of NaNs): this request alone
                out.failed.setdefault(rid, e)
                return
            self._keep(item, logits, picked, kept, out)
            return
        tokens, logprobs, tops, errors = sample(logits, [group.params] * n, [seq.generator] * n)
        for error in errors.values():
            out.failed.setdefault(rid, error)
            return
        kept = 0
        while kept < len(draft) and tokens[kept] == draft[kept]:
            kept += 1
        out.samples += [
            Sample(group, seq, tokens[i], logprobs[i], tops[i]) for i in range(kept + 1)
        ]
        out.accepted[seq.seq_id] = kept

    @staticmethod
    def _keep(
        item: ScheduledSeq, logits: torch.Tensor, picked: list[int], kept: int, out: SamplerOutput
    ) -> None:
        """The samples of a sampled drafted row's ``picked`` tokens (``kept`` drafts accepted),
        with their log-probabilities under the raw logits, as `sample` gives them."""
        p = item.group.params
        rows = logits[: len(picked)]
        logprobs = rows - torch.logsumexp(rows, -1, keepdim=True)
        at = torch.tensor(picked, device=logits.device).unsqueeze(1)
        chosen = logprobs.gather(1, at).squeeze(1).tolist()
        tops: list[dict[int, float] | None] = [None] * len(picked)
        if p.top_logprobs:
            counts = [p.top_logprobs] * len(picked)
            tops = list(top_logprobs(logprobs, list(range(len(picked))), counts))
        out.samples += [
            Sample(item.group, item.seq, token, lp, top)
            for token, lp, top in zip(picked, chosen, tops, strict=True)
        ]
        out.accepted[item.seq.seq_id] = kept

    def _rows(self, sampling: list[ScheduledSeq], logits: torch.Tensor, out: SamplerOutput) -> None:
        """The picks of plain, n-sample and beam rows: row i of ``logits`` is ``sampling[i]``."""
        constrained = [
            (row, item.group.params, item.seq.matcher)
            for row, item in enumerate(sampling)
            if item.seq.matcher is not None or item.group.params.logit_bias
        ]
        if constrained:  # logit biases and grammar masks first; a row that fails them fails
            for row, error in self.constraints.apply(logits, constrained).items():
                out.failed.setdefault(sampling[row].group.request_id, error)  # its request alone
        by_group: dict[str, list[tuple[Sequence, int]]] = {}
        groups: dict[str, SequenceGroup] = {}
        for row, item in enumerate(sampling):
            by_group.setdefault(item.group.request_id, []).append((item.seq, row))
            groups[item.group.request_id] = item.group
        targets: list[_Target] = []
        for rid, seq_rows in by_group.items():
            group = groups[rid]
            if rid in out.failed:
                continue
            if group.params.use_beam_search:
                try:
                    out.beams.append(propose(group, seq_rows, logits))
                except Exception as e:  # this request's beams cannot be scored: it fails alone
                    out.failed[rid] = e
                continue
            targets += [(group, seq, row, None, seq.generator) for seq, row in seq_rows]
            if group.params.n > 1 and not group.forked:
                # one prefill, then n samples from its logits, each for its own fork
                seq, row = seq_rows[0]
                targets += [
                    (group, seq, row, i, make_generator(group.params.seed, i, self.device))
                    for i in range(1, group.params.n)
                ]
        if targets:
            self._draw(targets, logits, out)

    def _draw(self, targets: list[_Target], logits: torch.Tensor, out: SamplerOutput) -> None:
        """Draw every target's token in one `sample` call into ``out``."""
        rows = [row for _, _, row, _, _ in targets]
        # the usual case, one row per sequence in order, needs no copy of the logits
        same = rows == list(range(logits.shape[0]))
        tokens, logprobs, tops, errors = sample(
            logits if same else logits[torch.tensor(rows, device=logits.device)],
            [g.params for g, _, _, _, _ in targets],
            [gen for _, _, _, _, gen in targets],
        )
        for row, error in errors.items():
            out.failed.setdefault(targets[row][0].request_id, error)
        out.samples += [  # (after a drafted row's picks: `_verify`)
            Sample(group, seq, tok, lp, top, fork, gen if fork is not None else None)
            for (group, seq, _, fork, gen), tok, lp, top in zip(
                targets, tokens, logprobs, tops, strict=True
            )
            if group.request_id not in out.failed
        ]


def propose(
    group: SequenceGroup, seq_rows: list[tuple[Sequence, int]], logits: torch.Tensor
) -> BeamCandidates:
    """The ``2 * beam_width`` best continuations of a beam group's live beams, from their rows
    of ``logits`` (twice the width: the ones that end go aside as hypotheses)."""
    p = group.params
    seqs = tuple(s for s, _ in seq_rows)
    rows = torch.tensor([r for _, r in seq_rows], device=logits.device)
    logprobs = torch.log_softmax(logits[rows], dim=-1)
    tops = (
        top_logprobs(logprobs, list(range(len(seqs))), [p.top_logprobs] * len(seqs))
        if p.top_logprobs
        else [None] * len(seqs)
    )
    found = beam_candidates(logprobs, [s.cumulative_logprob for s in seqs], 2 * p.beam_width)
    return BeamCandidates(group, seqs, tuple(found), tuple(tops))
