"""What a request looks like from outside after a step: its RequestOutput."""

from __future__ import annotations

from collections.abc import Callable

from chatpage.engine.outputs import CompletionOutput, RequestOutput
from chatpage.engine.sequence import GroupStatus, SequenceGroup

BeamScore = Callable[[SequenceGroup, float, int], float]
"""(group, cumulative logprob, length) -> the length-penalized beam score."""


def request_output(group: SequenceGroup, beam_score: BeamScore) -> RequestOutput:
    """The outputs of ``group`` now: a finished beam search answers with its hypotheses (best
    first), anything else with its sequences in index order. Lists are copies: the engine goes
    on with the originals."""
    finished = group.status is GroupStatus.FINISHED
    p = group.params

    def carried(logprobs: list[float], tops: list[dict[int, float]]) -> dict:
        """The per-token logprobs the request asked for."""
        return {"logprobs": list(logprobs) if p.logprobs is not None else None,
                "top_logprobs": list(tops) if p.top_logprobs else None}

    if p.use_beam_search and finished and group.beam_hypotheses:
        outputs = [
            CompletionOutput(i, h.token_ids, h.text, h.cumulative_logprob, h.finish_reason,
                             score=h.score, **carried(h.logprobs, h.top_logprobs))
            for i, h in enumerate(group.beam_hypotheses)
        ]
    else:
        outputs = [
            CompletionOutput(
                s.index, s.output_ids, s.detok.visible(s.finished), s.cumulative_logprob,
                s.finish_reason,
                score=beam_score(group, s.cumulative_logprob, s.num_output_tokens)
                if p.use_beam_search else None,
                **carried(s.logprobs, s.top_logprobs),
            )
            for s in sorted(group.seqs, key=lambda s: s.index)
        ]
    ttft = None
    if group.first_token_time is not None:
        ttft = group.first_token_time - group.arrival_time
    return RequestOutput(group.request_id, outputs, finished, group.prompt_token_ids,
                         group.prefix_hit_tokens, ttft)
