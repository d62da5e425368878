"""Applying the engine's updates to what a session is waiting for: one reply, or alternatives.

`Chats.apply` finds the session and its generation and folds the update into its request's
outputs (`OutputAccumulator`); these functions change the reply or the panes from those and
say what changed. A /continue'd reply adds the new text and tokens to what it had.
"""

from __future__ import annotations

from chatpage.chat.changes import CandidateUpdated, EntryUpdated
from chatpage.chat.entry import Entry, ReplyStats
from chatpage.chat.session import Candidate, ChatSession, Generation
from chatpage.engine.outputs import CompletionOutput, OutputDelta, RequestOutput, RequestUpdate
from chatpage.vocab import FinishReason, MessageStatus

FINAL_STATUS: dict[FinishReason, MessageStatus] = {
    FinishReason.STOP: MessageStatus.DONE,
    FinishReason.LENGTH: MessageStatus.DONE,
    FinishReason.ABORT: MessageStatus.STOPPED,
    FinishReason.ERROR: MessageStatus.ERROR,
}


CUT_SHORT = (FinishReason.ABORT, FinishReason.ERROR)
"""Reasons that end an output from outside (cancelled, failed): they bring no counts."""


def update_stats(
    stats: ReplyStats,
    out: RequestOutput,
    output: CompletionOutput,
    before: ReplyStats | None = None,
) -> None:
    """Copy the counts of ``output`` (of ``out``) into `stats` (on top of `before`, a continued
    reply's); an output cut short keeps the counts it had."""
    if output.finish_reason in CUT_SHORT:
        return
    stats.tokens = output.num_tokens + (before.tokens if before else 0)
    stats.prompt_tokens = out.usage.prompt_tokens
    stats.prefix_hit_tokens = out.usage.cached_tokens
    stats.disk_tokens = out.usage.disk_tokens
    stats.draft_tokens = out.usage.draft_tokens
    stats.accepted_tokens = out.usage.accepted_tokens
    stats.ttft_s = out.ttft_s
    stats.elapsed_s = out.elapsed_s


def _ids(output: CompletionOutput, before: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The output's token ids after ``before`` (a continued reply's); None where they are not
    all known (a server that names no ids, a continued reply whose ids were not known)."""
    if before is None or len(output.token_ids) != output.num_tokens or not output.num_tokens:
        return None
    return before + tuple(output.token_ids)


def thinking_tokens(delta: OutputDelta | None, output: CompletionOutput) -> int:
    """The tokens of ``delta`` spent thinking: those that brought thinking, or came while the
    output thinks and has no answer yet (its markers)."""
    if delta is None or not (delta.reasoning or (output.reasoning and not output.text)):
        return 0
    return delta.num_tokens


def apply_reply(
    session: ChatSession, gen: Generation, entry: Entry, update: RequestUpdate, out: RequestOutput
) -> bool:
    """One update of a plain reply (``out``: its outputs so far); True when the reply ended."""
    output = out.outputs[0] if out.outputs else None
    delta = next((d for d in update.outputs if d.index == 0), None)
    if entry.stats is not None and not entry.stats.tokens:  # how far the prompt's prefill is
        entry.stats.prompt_tokens = update.usage.prompt_tokens
        entry.stats.prefilled_tokens = update.usage.prefilled_tokens
    if output is not None:
        entry.content = gen.base_text + output.text
        entry.reasoning = gen.base_reasoning + output.reasoning
        entry.reasoning_tokens += thinking_tokens(delta, output)
        entry.token_ids = _ids(output, gen.base_ids if gen.continued is not None else ())
        if entry.stats is not None:
            update_stats(entry.stats, out, output, gen.continued)
    if update.finished:
        reason = output.finish_reason if output is not None else None
        entry.status = FINAL_STATUS[reason] if reason is not None else MessageStatus.DONE
        entry.error = update.error
    session.changed(EntryUpdated(entry, delta))
    return update.finished


def apply_candidate(
    session: ChatSession, gen: Generation, update: RequestUpdate, out: RequestOutput
) -> None:
    """One update of a request whose outputs are alternatives (one pane per output)."""
    deltas = {d.index: d for d in update.outputs}
    outputs = {c.index: c for c in out.outputs}
    for i, cand in enumerate(gen.candidates):
        if cand.request_id != update.request_id:
            continue
        delta = deltas.get(cand.index)
        output = outputs.get(cand.index) if delta is not None else None
        if output is not None:
            cand.text = output.text
            cand.reasoning = output.reasoning
            if delta is not None and delta.rewrite:  # (beams: the whole so far, counted anew)
                cand.reasoning_tokens = 0
            cand.reasoning_tokens += thinking_tokens(delta, output)
            cand.token_ids = _ids(output, ())
            cand.cumulative_logprob = output.cumulative_logprob
            cand.score = output.score
            update_stats(cand.stats, out, output)
            cand.finish_reason = cand.finish_reason or output.finish_reason
        if update.error is not None:
            cand.finish_reason, cand.error = FinishReason.ERROR, update.error
        elif output is None:
            continue
        session.changed(CandidateUpdated(i, delta))


def _candidate_status(cand: Candidate) -> MessageStatus:
    if cand.error is not None or cand.finish_reason is FinishReason.ERROR:
        return MessageStatus.ERROR
    if cand.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
        return MessageStatus.DONE
    return MessageStatus.STOPPED


def candidate_entry(cand: Candidate, token_source: str | None) -> Entry:
    """The reply an alternative becomes once one is kept."""
    return Entry(
        "assistant",
        cand.text,
        status=_candidate_status(cand),
        stats=cand.stats,
        label=cand.label,
        token_ids=cand.token_ids,
        token_source=token_source,
        reasoning=cand.reasoning,
        reasoning_tokens=cand.reasoning_tokens,
    )
