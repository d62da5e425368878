"""Beam search steps of LLMEngine: keep the best continuations, fork and free beams to match."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from chatpage.engine.block_manager import BlockManager
from chatpage.engine.sampler import beam_candidates, top_logprobs
from chatpage.engine.sequence import BeamHypothesis, Sequence, SequenceGroup
from chatpage.vocab import FinishReason

if TYPE_CHECKING:
    from collections.abc import Callable


class BeamSearch:
    """The beam-search half of the engine's step (mixed into LLMEngine)."""

    bm: BlockManager
    eos_ids: set[int]
    max_model_len: int
    _fork: Callable[[SequenceGroup, Sequence, int], Sequence]

    def _beam_score(self, group: SequenceGroup, cumulative: float, length: int) -> float:
        return cumulative / (max(length, 1) ** group.params.length_penalty)

    def _beam_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                   logits: torch.Tensor) -> None:
        """Keep the best ``beam_width`` continuations of all live beams; fork and free to match.

        Candidates ending in EOS (or a stop token) among the top ``beam_width`` become finished
        hypotheses. The search ends when ``beam_width`` hypotheses exist and no live beam can
        beat the worst of them at its current length, or at max_tokens.
        """
        p = group.params
        k = p.beam_width
        seqs = [s for s, _ in seq_rows]
        rows = torch.tensor([r for _, r in seq_rows], device=logits.device)
        logprobs = torch.log_softmax(logits[rows], dim=-1)
        # each beam's most likely next tokens, for a request that asks (per beam, as vLLM)
        tops = top_logprobs(logprobs, list(range(len(seqs))), [p.top_logprobs] * len(seqs)) \
            if p.top_logprobs else [None] * len(seqs)
        length = seqs[0].num_output_tokens + 1
        chosen: list[tuple[Sequence, int, float, dict[int, float] | None]] = []
        for rank, (b, tok, cum) in enumerate(
            beam_candidates(logprobs, [s.cumulative_logprob for s in seqs], 2 * k)
        ):
            parent = seqs[b]
            ends = tok in p.stop_token_ids or (tok in self.eos_ids and not p.ignore_eos)
            if ends:
                if rank < k:
                    self._add_hypothesis(group, parent, length, FinishReason.STOP,
                                         (tok, cum, tops[b]))
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
            placed.append((parent if n == 0 else self._fork(group, parent, 0), tok, cum, top))
        for s in seqs:
            if s.seq_id not in uses:
                self.bm.free(s)
                group.seqs.remove(s)
        for seq, tok, cum, top in placed:
            seq.append(tok, cum - seq.cumulative_logprob, top)
            seq.cumulative_logprob = cum
            if seq.detok.update(seq.token_ids):
                self._add_hypothesis(group, seq, length, FinishReason.STOP)
                seq.finish_reason = FinishReason.STOP
        live = [s for s in group.seqs if not s.finished]
        if live and (length >= p.max_tokens or len(live[0]) >= self.max_model_len):
            for s in live:
                self._add_hypothesis(group, s, length, FinishReason.LENGTH)
            done = True
        elif live and len(group.beam_hypotheses) >= k:
            best_live = max(self._beam_score(group, s.cumulative_logprob, length) for s in live)
            done = group.beam_hypotheses[-1].score >= best_live
        else:
            done = not live
        if done:
            for s in live:
                s.finish_reason = FinishReason.STOP
        for i, s in enumerate(sorted(live, key=lambda s: -s.cumulative_logprob)):
            s.index = i

    def _add_hypothesis(self, group: SequenceGroup, seq: Sequence, length: int,
                        reason: FinishReason,
                        ending: tuple[int, float, dict[int, float] | None] | None = None) -> None:
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
        hyps.append(BeamHypothesis(ids, cum, self._beam_score(group, cum, length),
                                   seq.detok.text, reason, logprobs, tops))
        hyps.sort(key=lambda h: -h.score)
        del hyps[group.params.beam_width:]
