"""Chats: every session, and the turns between them and the engine client.

This is the UI's one user of `EngineClient`. It never waits on the engine: `submit`/`cancel` only
queue, and the client's events come back through `deliver` (the app posts them to its own thread)
and are applied here with `apply`, on the UI thread.
"""

from __future__ import annotations

from collections.abc import Callable

from chatpage.chat.session import (
    MAX_ALTERNATIVES,
    MIN_ALTERNATIVES,
    SETTING_BY_FIELD,
    AltMode,
    Attachment,
    Candidate,
    ChatSession,
    Entry,
    EntryStatus,
    Generation,
    Observer,
    ReplyStats,
    SamplingSettings,
)
from chatpage.config.personas import Persona
from chatpage.engine.client import EngineClient, StreamEvent
from chatpage.store import make_title

TITLE_WIDTH = 32
_FINAL_STATUS: dict[str | None, EntryStatus] = {
    "stop": "done", "length": "done", "abort": "stopped", "error": "error",
}


class ChatError(ValueError):
    """Something the user asked for cannot be done now; the message is one line for them."""


class Chats:
    """The open sessions, in sidebar order."""

    def __init__(self, client: EngineClient, deliver: Callable[[StreamEvent], None]) -> None:
        self.client = client
        self.deliver = deliver
        self.sessions: list[ChatSession] = []
        self.observers: list[Observer] = []
        """Given to every session opened or adopted from now on (e.g. a store that saves them)."""
        self._next_id = 1
        self._by_request: dict[str, ChatSession] = {}

    # -- sessions ------------------------------------------------------------------------------
    @property
    def next_id(self) -> int:
        """The id the next new session gets (for building one to `adopt`)."""
        return self._next_id

    def open(self, persona: Persona) -> ChatSession:
        """A new, empty session with ``persona``'s sampling defaults."""
        return self.adopt(ChatSession.new(self._next_id, persona))

    def adopt(self, session: ChatSession) -> ChatSession:
        """Add an existing session (e.g. one restored from the store); ids stay unique."""
        if self.get(session.id) is not None:
            raise ValueError(f"session id {session.id} is already open")
        self._next_id = max(self._next_id, session.id + 1)
        session.observers.extend(o for o in self.observers if o not in session.observers)
        self.sessions.append(session)
        return session

    def close(self, session: ChatSession) -> None:
        """Stop what the session is generating (a reply in progress ends "stopped") and
        forget it; observers hear "closed" last."""
        self._drop_generation(session)
        self.sessions.remove(session)
        session.changed("closed")

    def get(self, session_id: int) -> ChatSession | None:
        return next((s for s in self.sessions if s.id == session_id), None)

    # -- turns ---------------------------------------------------------------------------------
    def send(self, session: ChatSession, text: str) -> None:
        """Add the user's message (with the pending attachments) and ask for the reply."""
        self._check_idle(session)
        text = text.strip()
        if not text and not session.attachments:
            raise ChatError("the message is empty: type something first")
        entry = Entry("user", text, attachments=list(session.attachments))
        if session.attachments:
            session.attachments = []
            session.changed("attachments")
        session.entries.append(entry)
        session.changed("entry_added", entry)
        if session.title == "New chat":
            session.title = make_title(text or entry.attachments[0].name, TITLE_WIDTH)
            session.changed("title")
        self._ask(session)

    def regenerate(self, session: ChatSession) -> None:
        """Drop the last reply (or the alternatives on show) and ask again."""
        if session.choosing and not session.streaming:
            self._drop_generation(session)
        self._check_idle(session)
        if session.entries and session.entries[-1].role == "assistant":
            session.entries.pop()
            session.changed("entries_reset")
        if not session.entries or session.entries[-1].role != "user":
            raise ChatError("there is no message to answer yet")
        self._ask(session)

    def edit_last(self, session: ChatSession) -> str:
        """Drop the last exchange; returns the user's text (attachments go back to pending)."""
        index = next((i for i in range(len(session.entries) - 1, -1, -1)
                      if session.entries[i].role == "user"), None)
        if index is None:
            raise ChatError("there is no message of yours to edit")
        self.stop(session)
        self._drop_generation(session)
        user = session.entries[index]
        del session.entries[index:]
        session.changed("entries_reset")
        session.attachments = list(user.attachments) + session.attachments
        session.changed("attachments")
        return user.content

    def clear(self, session: ChatSession) -> None:
        self.stop(session)
        self._drop_generation(session)
        session.entries.clear()
        session.changed("entries_reset")

    def stop(self, session: ChatSession) -> bool:
        """Cancel what is streaming; the engine frees its blocks and reports "abort"."""
        gen = session.generation
        if gen is None or not gen.streaming:
            return False
        for rid in gen.request_ids:
            if rid not in gen.finished_requests:
                self.client.cancel(rid)
        return True

    def keep(self, session: ChatSession, number: int) -> Entry:
        """Keep alternative ``number`` (1-based) as the reply; the others are dropped."""
        gen = session.generation
        if gen is None or not gen.alternatives:
            raise ChatError("there are no alternatives to choose from")
        if not 1 <= number <= len(gen.candidates):
            raise ChatError(f"choose an alternative from 1 to {len(gen.candidates)}")
        chosen = gen.candidates[number - 1]
        if chosen.error:
            raise ChatError(f"alternative {number} failed: {chosen.error}")
        status = "done" if chosen.finish_reason in ("stop", "length") else "stopped"
        entry = Entry("assistant", chosen.text, status=status, stats=chosen.stats,
                      label=chosen.label)
        self._drop_generation(session)
        session.entries.append(entry)
        session.changed("entry_added", entry)
        return entry

    def set_setting(self, session: ChatSession, name: str, raw: str | float | int | None) -> None:
        """Set one sampling setting from user input (ValueError names it and the rule)."""
        self.set_sampling(session, session.sampling.with_value(name, raw))

    def set_sampling(self, session: ChatSession, settings: SamplingSettings) -> None:
        settings.params()  # validated before it is kept
        session.sampling = settings
        session.changed("settings")

    def set_alt_mode(self, session: ChatSession, mode: AltMode) -> None:
        if mode.kind != "off" and not MIN_ALTERNATIVES <= mode.k <= MAX_ALTERNATIVES:
            raise ChatError(
                f"{mode.kind} must be from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}, got {mode.k}"
            )
        session.alt_mode = mode
        session.changed("settings")

    def attach(self, session: ChatSession, attachment: Attachment) -> None:
        session.attachments.append(attachment)
        session.changed("attachments")

    def detach(self, session: ChatSession) -> None:
        session.attachments.clear()
        session.changed("attachments")

    def rename(self, session: ChatSession, title: str) -> None:
        session.title = title.strip() or session.title
        session.changed("title")

    def compare(self, session: ChatSession, name: str, values: list[str]) -> None:
        """Answer the last message once per value of setting ``name``, each in its own pane."""
        self._check_idle(session)
        if not any(e.role == "user" for e in session.entries):
            raise ChatError("send a message first: /compare answers your last message again")
        if not MIN_ALTERNATIVES <= len(values) <= MAX_ALTERNATIVES:
            raise ChatError(f"/compare takes {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} values, "
                            f"got {len(values)}")
        info = SETTING_BY_FIELD[name]
        settings = [session.sampling.with_value(name, raw) for raw in values]
        labels = [f"{_short(name)}={getattr(s, name)}" for s in settings]
        if len(set(labels)) != len(labels):
            raise ChatError(f"/compare needs different values of {info.label}")
        if session.entries[-1].role == "assistant":
            session.entries.pop()  # its last reply is replaced by the comparison
            session.changed("entries_reset")
        messages = session.for_model()
        gen = Generation("compare", [])
        for label, setting in zip(labels, settings, strict=True):
            rid = self.client.submit(messages, setting.params(), self.deliver)
            gen.request_ids.append(rid)
            gen.candidates.append(Candidate(label, rid, 0))
            self._by_request[rid] = session
        self._start(session, gen)

    # -- engine events -------------------------------------------------------------------------
    def apply(self, event: StreamEvent) -> ChatSession | None:
        """Apply one engine event; returns the session it changed (None if it was stale)."""
        session = self._by_request.get(event.request_id)
        gen = session.generation if session is not None else None
        if gen is None or event.request_id not in gen.request_ids:
            return None
        if event.request_finished:
            gen.finished_requests.add(event.request_id)
            self._by_request.pop(event.request_id, None)
        if gen.entry is not None:
            self._apply_reply(session, gen, gen.entry, event)
        else:
            self._apply_candidate(session, gen, event)
        return session

    def _apply_reply(self, session: ChatSession, gen: Generation, entry: Entry,
                     event: StreamEvent) -> None:
        entry.content = event.text
        _update_stats(entry.stats, event)
        if event.request_finished:
            entry.status = _FINAL_STATUS.get(event.finish_reason, "done")
            entry.error = event.error
            session.generation = None
            session.changed("entry_updated", entry)
            session.changed("busy")
        else:
            session.changed("entry_updated", entry)

    def _apply_candidate(self, session: ChatSession, gen: Generation, event: StreamEvent) -> None:
        failed = event.finish_reason == "error" and event.request_finished
        for i, cand in enumerate(gen.candidates):
            if cand.request_id != event.request_id:
                continue
            mine = cand.index == event.index
            if mine and not _is_notice(event):
                cand.text = event.text
                cand.cumulative_logprob = event.cumulative_logprob
                cand.score = event.score
                _update_stats(cand.stats, event)
            if failed:
                cand.finish_reason, cand.error = "error", event.error
            elif mine and event.finished or event.request_finished:
                cand.finish_reason = cand.finish_reason or event.finish_reason or "stop"
            elif not mine:
                continue
            session.changed("candidate_updated", index=i)
        if not gen.streaming:
            if all(c.error for c in gen.candidates):
                self._drop_generation(session)
                entry = Entry("assistant", "", status="error", error=gen.candidates[0].error)
                session.entries.append(entry)
                session.changed("entry_added", entry)
            else:
                session.changed("busy")

    # -- helpers -------------------------------------------------------------------------------
    def _check_idle(self, session: ChatSession) -> None:
        if self.client.error is not None and not self.client.ready:
            raise ChatError(f"the model did not load ({self.client.error}); restart chatpage "
                            "with a working --model")
        if session.streaming:
            raise ChatError("a reply is still streaming in this chat: wait for it, or press "
                            "esc to stop it")
        if session.choosing:
            n = len(session.generation.candidates)
            raise ChatError(f"keep one of the alternatives first: press 1-{n}, click a pane, "
                            "or type /keep N")

    def _ask(self, session: ChatSession) -> None:
        """Submit the session's messages as one reply or as alternatives (the next-reply mode)."""
        mode = session.alt_mode
        messages = session.for_model()
        if mode.kind == "off":
            params = session.sampling.params()
            rid = self.client.submit(messages, params, self.deliver)
            entry = Entry("assistant", "", status="streaming", stats=ReplyStats())
            session.entries.append(entry)
            session.changed("entry_added", entry)
            gen = Generation("reply", [rid], entry=entry)
        else:
            if mode.kind == "samples":
                params = session.sampling.params(n=mode.k)
            else:
                params = session.sampling.params(beam_width=mode.k)
            rid = self.client.submit(messages, params, self.deliver)
            noun = "sample" if mode.kind == "samples" else "beam"
            gen = Generation(mode.kind, [rid], candidates=[
                Candidate(f"{noun} {i + 1}", rid, i) for i in range(mode.k)
            ])
            session.alt_mode = AltMode(k=mode.k)  # one reply only: back to single replies
            session.changed("settings")
        for rid in gen.request_ids:
            self._by_request[rid] = session
        self._start(session, gen)

    def _start(self, session: ChatSession, gen: Generation) -> None:
        session.generation = gen
        if gen.alternatives:
            session.changed("generation")
        session.changed("busy")

    def _drop_generation(self, session: ChatSession) -> None:
        gen = session.generation
        if gen is None:
            return
        for rid in gen.request_ids:
            self._forget(rid, cancel=rid not in gen.finished_requests)
        session.generation = None
        if gen.entry is not None and gen.entry in session.entries:
            gen.entry.status = "stopped"
            session.changed("entry_updated", gen.entry)
        if gen.alternatives:
            session.changed("generation")
        session.changed("busy")

    def _forget(self, rid: str, cancel: bool) -> None:
        self._by_request.pop(rid, None)
        if cancel:
            self.client.cancel(rid)


def _is_notice(event: StreamEvent) -> bool:
    """A cancel/failure notice from the client: it carries no counts, only the final reason."""
    return event.finish_reason in ("abort", "error") and event.num_tokens == 0


def _update_stats(stats: ReplyStats | None, event: StreamEvent) -> None:
    if stats is None or _is_notice(event):
        return
    stats.tokens = event.num_tokens
    stats.prompt_tokens = event.prompt_tokens
    stats.prefix_hit_tokens = event.prefix_hit_tokens
    stats.ttft_s = event.ttft_s
    stats.elapsed_s = event.elapsed_s


def _short(name: str) -> str:
    return {"temperature": "temp", "max_tokens": "max"}.get(name, name)
