"""Beam search over the paged cache: choose the best of the sampler's proposals, fork and free
beams to match (a part of the scheduler's update)."""

from __future__ import annotations

import math

from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.sequence import BeamHypothesis, Sequence, SequenceGroup
from chatpage.engine.core.step import BeamCandidates
from chatpage.engine.core.stop import StopCheck
from chatpage.vocab import FinishReason

_EXP_MAX = math.log(1.7e308)  # math.exp overflows past this


def score(group: SequenceGroup, cumulative: float, length: int) -> float:
    """The length-penalized score of a beam, ``cumulative / length ** length_penalty``
    (-inf or -0.0 where that leaves the float range). Beams are ranked by `rank`."""
    r = rank(group, cumulative, length)
    if r == math.inf:
        return 0.0
    return -math.exp(-r) if r > -_EXP_MAX else -math.inf


def rank(group: SequenceGroup, cumulative: float, length: int) -> float:
    """The score's order in log space, higher is better: ``-log(-score)``, which no length
    penalty overflows or divides by zero (+inf for a beam of log-probability 0)."""
    if cumulative >= 0:
        return math.inf
    return group.params.length_penalty * math.log(max(length, 1)) - math.log(-cumulative)


class BeamSearch:
    """Keeps the ``beam_width`` best continuations of a group's beams, step by step."""

    def __init__(self, bm: BlockManager, stop: StopCheck) -> None:
        self.bm = bm
        self.stop = stop

    def step(self, picks: BeamCandidates) -> None:
        """Keep the best ``beam_width`` continuations; fork and free beams to match.

        Candidates ending in EOS (or a stop token) among the top ``beam_width`` become finished
        hypotheses. The search ends when ``beam_width`` hypotheses exist and no live beam can
        beat the worst of them at its current length, or at max_tokens.
        """
        group, seqs, tops = picks.group, picks.seqs, picks.tops
        p = group.params
        k = p.beam_width
        length = seqs[0].num_output_tokens + 1
        chosen: list[tuple[Sequence, int, float, dict[int, float] | None]] = []
        for place, (b, tok, cum) in enumerate(picks.candidates):
            parent = seqs[b]
            if self.stop.ends_on(p, tok):
                if place < k:
                    self._add_hypothesis(
                        group, parent, length, FinishReason.STOP, (tok, cum, tops[b])
                    )
            else:
                chosen.append((parent, tok, cum, tops[b]))
            if len(chosen) == k:
                break
        # fork the parents chosen more than once, free those not chosen, then append tokens
        uses: dict[int, int] = {}
        placed: list[tuple[Sequence, int, float, dict[int, float] | None]] = []
        for parent, tok, cum, top in chosen:
            n = uses.get(parent.seq_id, 0)
            uses[parent.seq_id] = n + 1
            if n:
                child = group.fork(parent, 0)
                self.bm.fork(parent, child)
                parent = child
            placed.append((parent, tok, cum, top))
        for s in seqs:
            if s.seq_id not in uses:
                self.bm.free(s)
                group.seqs.remove(s)
        at_length = False
        for seq, tok, cum, top in placed:
            seq.append(tok, cum - seq.cumulative_logprob, top)
            seq.cumulative_logprob = cum
            match self.stop(p, seq):
                case FinishReason.STOP:  # a stop string
                    self._add_hypothesis(group, seq, length, FinishReason.STOP)
                    seq.finish_reason = FinishReason.STOP
                case FinishReason.LENGTH:  # the beams are all as long: every live one is
                    at_length = True
        live = [s for s in group.seqs if not s.finished]
        if at_length:
            for s in live:
                self._add_hypothesis(group, s, length, FinishReason.LENGTH)
            done = True
        elif live and len(group.beam_hypotheses) >= k:
            best_live = max(rank(group, s.cumulative_logprob, length) for s in live)
            done = self._rank_of(group, group.beam_hypotheses[-1]) >= best_live
        else:
            done = not live
        if done:
            for s in live:
                s.finish_reason = FinishReason.LENGTH if at_length else FinishReason.STOP
        for i, s in enumerate(sorted(live, key=lambda s: -s.cumulative_logprob)):
            s.index = i

    def _add_hypothesis(
        self,
        group: SequenceGroup,
        seq: Sequence,
        length: int,
        reason: FinishReason,
        ending: tuple[int, float, dict[int, float] | None] | None = None,
    ) -> None:
        """Keep ``seq`` as a finished hypothesis; ``ending``: a stop token to end it with (not
        added to ``seq``), its new cumulative log-probability and the step's most likely tokens.
        """
        ids, cum = seq.output_ids, seq.cumulative_logprob
        logprobs, tops = list(seq.logprobs), list(seq.top_logprobs)
        if ending is not None:
            tok, cum, top = ending
            ids.append(tok)
            logprobs.append(cum - seq.cumulative_logprob)
            if top is not None:
                tops.append(top)
        hyps = group.beam_hypotheses
        hyps.append(
            BeamHypothesis(
                ids, cum, score(group, cum, length), seq.detok.text, reason, logprobs, tops
            )
        )
        hyps.sort(key=lambda h: -self._rank_of(group, h))
        del hyps[group.params.beam_width :]

    def _rank_of(self, group: SequenceGroup, hyp: BeamHypothesis) -> float:
        return rank(group, hyp.cumulative_logprob, len(hyp.token_ids))
