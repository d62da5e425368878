"""What changed in a request in one step: its `RequestUpdate`, the deltas since the last one.

Each sequence remembers what it has reported (tokens, and whether its end): plain replies and n
samples send the new tokens and the detokenizer's own delta of visible text. Beam search reorders
its beams every step, so a live beam is sent whole as a rewrite (``rewrite=True``), and the
finished search answers with its hypotheses, best first, rewriting every output once more.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq

from chatpage.engine.core.beam import score
from chatpage.engine.core.sequence import GroupStatus, Sequence, SequenceGroup
from chatpage.engine.outputs import (
    OutputDelta,
    RequestUpdate,
    ToolCallDelta,
    Usage,
    final_update,
)
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import FinishReason


def request_update(group: SequenceGroup) -> RequestUpdate:
    """The outputs of ``group`` that changed since its previous update."""
    finished = group.status is GroupStatus.FINISHED
    if not group.params.use_beam_search:
        changed = [
            s
            for s in group.seqs
            if s.num_output_tokens > s.num_reported or (s.finished and not s.end_reported)
        ]
        outputs = tuple(_appended(s, group.params) for s in sorted(changed, key=_index))
        return _update(group, outputs, sum(s.num_output_tokens for s in group.seqs), finished)
    if finished and group.beam_hypotheses:
        hyps = group.beam_hypotheses
        outputs = tuple(
            _rewrite(
                i,
                _split(group, h.text),
                h.token_ids,
                h.logprobs,
                h.top_logprobs,
                group.params,
                h.cumulative_logprob,
                h.score,
                h.finish_reason,
            )
            for i, h in enumerate(hyps)
        )
        return _update(group, outputs, sum(len(h.token_ids) for h in hyps), True)
    live = sorted(group.live_seqs, key=_index)
    outputs = tuple(
        _rewrite(
            s.index,
            _split(group, s.detok.visible(False)),
            s.output_ids,
            s.logprobs,
            s.top_logprobs,
            group.params,
            s.cumulative_logprob,
            score(group, s.cumulative_logprob, s.num_output_tokens),
            None,
        )
        for s in live
    )
    return _update(group, outputs, sum(s.num_output_tokens for s in live), finished)


def closing_update(
    group: SequenceGroup, reason: FinishReason, error: str | None = None
) -> RequestUpdate:
    """End ``group`` from outside its step (cancelled: ABORT; failed: ERROR and ``error``):
    every output still live ends with ``reason`` and no new text."""
    live = sorted(group.live_seqs, key=_index)
    for seq in live:
        seq.finish_reason, seq.end_reported = reason, True
    return final_update(
        group.request_id,
        reason,
        [s.index for s in live],
        error,
        _usage(group, sum(s.num_output_tokens for s in group.seqs)),
        *_times(group),
    )


def _index(seq: Sequence) -> int:
    return seq.index


Split = tuple[str, str, tuple[ToolCallDelta, ...]]
"""A whole reply's reasoning, answer and tool calls (one delta per call)."""


def _split(group: SequenceGroup, text: str) -> Split:
    """(reasoning, answer, calls) of a whole reply of ``group``."""
    reasoning = ""
    if group.thinking is not None:
        reasoning, text = group.thinking.copy().feed(text, final=True)
    if group.tools is None:
        return reasoning, text, ()
    return reasoning, *group.tools.copy().feed(text, final=True)


def _appended(seq: Sequence, p: SamplingParams) -> OutputDelta:
    """What ``seq`` gained since it last reported: new tokens, their logprobs, new text (its
    thinking and tool calls apart)."""
    start = seq.num_reported
    ids = tuple(seq.token_ids[seq.prompt_len + start :])
    seq.num_reported = seq.num_output_tokens
    seq.end_reported = seq.finished
    text, reasoning = seq.detok.take(seq.finished), ""
    calls: tuple[ToolCallDelta, ...] = ()
    if seq.thinking is not None:
        reasoning, text = seq.thinking.feed(text, seq.finished)
    if seq.tools is not None:
        text, calls = seq.tools.feed(text, seq.finished)
    return OutputDelta(
        seq.index,
        text,
        ids,
        reasoning=reasoning,
        tool_calls=calls,
        logprobs=tuple(seq.logprobs[start:]) if p.logprobs is not None else None,
        top_logprobs=tuple(seq.top_logprobs[start:]) if p.top_logprobs else None,
        finish_reason=seq.finish_reason,
        cumulative_logprob=seq.cumulative_logprob,
        num_tokens=len(ids),
    )


def _rewrite(
    index: int,
    split: Split,
    ids: Seq[int],
    logprobs: Seq[float],
    tops: Seq[dict[int, float]],
    p: SamplingParams,
    cumulative: float,
    score: float | None,
    reason: FinishReason | None,
) -> OutputDelta:
    """A whole beam (or hypothesis) so far, replacing what output ``index`` showed; ``split``:
    its (reasoning, answer, calls)."""
    return OutputDelta(
        index,
        split[1],
        tuple(ids),
        reasoning=split[0],
        tool_calls=split[2],
        logprobs=tuple(logprobs) if p.logprobs is not None else None,
        top_logprobs=tuple(tops) if p.top_logprobs else None,
        finish_reason=reason,
        cumulative_logprob=cumulative,
        score=score,
        rewrite=True,
        num_tokens=len(ids),
    )


def _update(
    group: SequenceGroup, outputs: tuple[OutputDelta, ...], completion_tokens: int, finished: bool
) -> RequestUpdate:
    ttft, elapsed = _times(group)
    return RequestUpdate(
        group.request_id,
        outputs,
        _usage(group, completion_tokens),
        finished=finished,
        ttft_s=ttft,
        elapsed_s=elapsed,
    )


def _usage(group: SequenceGroup, completion_tokens: int) -> Usage:
    prefilled = min(group.prompt_len, max((s.num_computed_tokens for s in group.seqs), default=0))
    return Usage(
        group.prompt_len,
        group.prefix_hit_tokens,
        completion_tokens,
        prefilled,
        group.disk_hit_tokens,
        sum(s.drafted for s in group.seqs),
        sum(s.accepted for s in group.seqs),
    )


def _times(group: SequenceGroup) -> tuple[float | None, float]:
    """Arrival to the first generated token (None before it), and arrival to now."""
    ttft = None
    if group.first_token_time is not None:
        ttft = group.first_token_time - group.arrival_time
    return ttft, time.monotonic() - group.arrival_time
