"""Applying the engine's events to what a session is waiting for: one reply, or alternatives.

`Chats.apply` finds the session and its generation; these functions change the reply or the
panes and say what changed. A /continue'd reply adds the new text and tokens to what it had.
"""

from __future__ import annotations

from chatpage.chat.session import (
    CandidateUpdated,
    ChatSession,
    Entry,
    EntryUpdated,
    Generation,
    ReplyStats,
)
from chatpage.engine.client import StreamEvent
from chatpage.store import MessageStatus

FINAL_STATUS: dict[str | None, MessageStatus] = {
    "stop": MessageStatus.DONE, "length": MessageStatus.DONE, "abort": MessageStatus.STOPPED,
    "error": MessageStatus.ERROR,
}


def is_notice(event: StreamEvent) -> bool:
    """A cancel/failure notice from the client: it carries no counts, only the final reason."""
    return event.finish_reason in ("abort", "error") and event.num_tokens == 0


def update_stats(stats: ReplyStats | None, event: StreamEvent,
                 before: ReplyStats | None = None) -> None:
    """Copy the event's counts into `stats` (on top of `before`, a continued reply's)."""
    if stats is None or is_notice(event):
        return
    stats.tokens = event.num_tokens + (before.tokens if before else 0)
    stats.prompt_tokens = event.prompt_tokens
    stats.prefix_hit_tokens = event.prefix_hit_tokens
    stats.ttft_s = event.ttft_s
    stats.elapsed_s = event.elapsed_s


def apply_reply(session: ChatSession, gen: Generation, entry: Entry, event: StreamEvent) -> bool:
    """One event of a plain reply; True when the reply ended."""
    entry.content = gen.base_text + event.text
    update_stats(entry.stats, event, gen.continued)
    if event.request_finished:
        entry.status = FINAL_STATUS.get(event.finish_reason, MessageStatus.DONE)
        entry.error = event.error
    session.changed(EntryUpdated(entry))
    return event.request_finished


def apply_candidate(session: ChatSession, gen: Generation, event: StreamEvent) -> None:
    """One event of a request whose outputs are alternatives (one pane per output)."""
    failed = event.finish_reason == "error" and event.request_finished
    for i, cand in enumerate(gen.candidates):
        if cand.request_id != event.request_id:
            continue
        mine = cand.index == event.index
        if mine and not is_notice(event):
            cand.text = event.text
            cand.cumulative_logprob = event.cumulative_logprob
            cand.score = event.score
            update_stats(cand.stats, event)
        if failed:
            cand.finish_reason, cand.error = "error", event.error
        elif mine and event.finished:  # (each output gets its own final event)
            cand.finish_reason = cand.finish_reason or event.finish_reason or "stop"
        elif not mine:
            continue
        session.changed(CandidateUpdated(i))
