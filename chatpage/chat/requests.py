"""Requests: what the chats ask of the engine and what comes back; `Chats` holds one
(`Chats.requests`), the only part of it that talks to the `EngineClient`.

It never waits on the engine: `submit`/`cancel` only queue, and the client's updates come back
through `deliver` (the app posts them to its own thread) and are applied with `apply`, on the
UI thread. A reply is a new version of the turn after the message it answers; alternatives are
offered side by side (no version on show) until one is kept, and then all of them are versions.
Before anything is sent, `fit` leaves the oldest turns out if the chat outgrew the context.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from chatpage.chat.changes import (
    BusyChanged,
    ContextChanged,
    EntryAdded,
    EntryUpdated,
    GenerationChanged,
    PathChanged,
    SettingsChanged,
)
from chatpage.chat.context import Fit, fit
from chatpage.chat.entry import Entry, ReplyStats
from chatpage.chat.mcp import McpServers
from chatpage.chat.replies import apply_candidate, apply_reply, candidate_entry
from chatpage.chat.sampling import AltMode, compare_labels
from chatpage.chat.session import Candidate, ChatSession, Generation
from chatpage.chat.tool_loop import ToolLoop
from chatpage.chat.tool_turns import functions
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestUpdate
from chatpage.engine.protocol import ChatRequest, EngineClient, UpdateCallback
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import MessageStatus, UserError


class ChatError(UserError):
    """Something the user asked for cannot be done now; the message is one line for them."""


class Requests:
    """The chats' requests to the engine, by request id. `notify` gets one-line notices (a
    turn that had to leave old messages out to fit the context, an MCP server that failed);
    ``tools``: the MCP servers whose tools a reply may call, in its `tool_loop`."""

    def __init__(
        self,
        client: EngineClient[object],
        deliver: UpdateCallback,
        notify: Callable[[str], None] = lambda _line: None,
        tools: McpServers | None = None,
    ) -> None:
        self.client = client
        self.deliver = deliver
        self.notify = notify
        self.tool_loop = ToolLoop(self, tools if tools is not None else McpServers({}, notify))
        self._by_request: dict[str, ChatSession] = {}
        self._outputs = OutputAccumulator()  # what each request in flight has said so far
        self._tool_pins: set[tuple[str, str]] = set()  # (system prompt, tools) pinned

    def stop(self, session: ChatSession) -> bool:
        """Cancel what is streaming; the engine frees its blocks and ends it with ABORT."""
        gen = session.generation
        if gen is None or not gen.streaming:
            return False
        if gen.tools_busy and len(gen.finished_requests) == len(gen.request_ids):
            self.drop(session)  # tools asked for, running or starting: no request
            return True
        for rid in gen.request_ids:
            if rid not in gen.finished_requests:
                self.client.cancel(rid)
        return True

    def keep(self, session: ChatSession, number: int) -> Entry:
        """Keep alternative ``number`` (1-based) as the reply; the others stay as its
        versions (those that did not fail)."""
        gen = session.generation
        if gen is None or not gen.alternatives:
            raise ChatError("there are no alternatives to choose from")
        if not 1 <= number <= len(gen.candidates):
            raise ChatError(f"choose an alternative from 1 to {len(gen.candidates)}")
        chosen = gen.candidates[number - 1]
        if chosen.error:
            raise ChatError(f"alternative {number} failed: {chosen.error}")
        self.drop(session)
        kept = candidate_entry(chosen, self.client.model_name)
        for cand in gen.candidates:
            if cand.error and cand is not chosen:
                continue
            entry = kept if cand is chosen else candidate_entry(cand, self.client.model_name)
            session.transcript.attach(entry, gen.parent, current=cand is chosen)
            session.changed(EntryAdded(entry))
        session.changed(PathChanged())
        return kept

    # -- engine updates ------------------------------------------------------------------------
    def apply(self, update: RequestUpdate) -> ChatSession | None:
        """Apply one engine update; returns the session it changed (None if it was stale)."""
        session = self._by_request.get(update.request_id)
        gen = session.generation if session is not None else None
        if session is None or gen is None or update.request_id not in gen.request_ids:
            return None
        out = self._outputs.add(update)
        if update.finished:
            gen.finished_requests.add(update.request_id)
            self._by_request.pop(update.request_id, None)
        if gen.entry is not None:
            if apply_reply(session, gen, gen.entry, update, out) and not self.tool_loop.called(
                session, gen, out.outputs[0].tool_calls if out.outputs else []
            ):
                session.generation = None
                session.changed(BusyChanged())
            return session
        apply_candidate(session, gen, update, out)
        if not gen.streaming:
            if all(c.error for c in gen.candidates):
                self.drop(session)
                entry = Entry(
                    "assistant", "", status=MessageStatus.ERROR, error=gen.candidates[0].error
                )
                session.transcript.attach(entry, gen.parent)
                session.changed(EntryAdded(entry))
            else:
                session.changed(BusyChanged())
        return session

    def apply_all(self, updates: list[RequestUpdate]) -> None:
        """Apply a batch of updates in order (each brings only what its step added)."""
        for update in updates:
            self.apply(update)

    # -- helpers -------------------------------------------------------------------------------
    def check_idle(self, session: ChatSession) -> None:
        if self.client.error is not None and not self.client.ready:
            raise ChatError(
                f"the model did not load ({self.client.error}); switch to another "
                "with /model PATH, or /model default"
            )
        if session.streaming:
            raise ChatError(
                "a reply is still streaming in this chat: wait for it, or press esc to stop it"
            )
        if session.choosing and session.generation is not None:
            n = len(session.generation.candidates)
            raise ChatError(
                f"keep one of the alternatives first: press 1-{n}, click a pane, or type /keep N"
            )

    def fit(self, session: ChatSession, upto: Entry | None, notice: bool = True) -> Fit:
        """Leave the oldest turns out of what is sent if the turn after `upto` (None: after
        the last message on show) would not fit the context; `notice` says so to the user."""
        session.context_tokens = self.client.max_model_len or session.context_tokens
        outcome = fit(
            session.persona.system_prompt,
            session.transcript.path(upto),
            session.sampling.max_tokens,
            session.context_tokens,
            self.client.counter,
        )
        session.prompt_tokens = outcome.needed - session.sampling.max_tokens
        session.changed(ContextChanged())
        note = outcome.notice()
        if notice and note:
            self.notify(note)
        return outcome

    def submit(
        self,
        session: ChatSession,
        upto: Entry,
        params: SamplingParams,
        continue_reply: bool = False,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str = "auto",
    ) -> str:
        """Submit what the model sees up to `upto`, the replies it wrote as their own ids;
        /think's choice where the model has the switch (after a switch to a model without
        one, the choice is dropped with a notice); ``tools``: the function tools it may call,
        ``tool_choice`` whether it must (`EngineClient.submit`)."""
        if session.thinking is not None and self.client.thinking_switch is None:
            session.thinking = None
            self.notify(
                f"{self.client.model_name} has no thinking switch in its chat template: "
                "/think no longer applies to this chat"
            )
        request = ChatRequest(
            session.for_model(upto=upto),
            replace(params, speculate=session.speculate),
            continue_reply=continue_reply,
            reply_ids=session.reply_ids(self.client.model_name, upto),
            tools=tools,
            tool_choice=tool_choice,
            thinking=session.thinking,
            draft_texts=other_versions(upto),
        )
        rid = self.client.submit(request, self.deliver)
        self._by_request[rid] = session  # where its updates go
        if tools:
            self._pin_with_tools(request.messages[0], tools)
        return rid

    def _pin_with_tools(self, first: dict[str, Any], tools: list[dict[str, Any]]) -> None:
        """Pin a system prompt with the tools a chat offers (the template renders them into
        the prompt's start: a tool-using persona's real prefix), once per prompt and tools;
        after the request that brought them, which computes the prefix the pin then finds."""
        if first.get("role") != "system" or not isinstance(first.get("content"), str):
            return
        key = (first["content"], json.dumps(tools, sort_keys=True))
        if key not in self._tool_pins:
            self._tool_pins.add(key)
            self.client.pin_system_prompt(first["content"], tools)

    def round(self, session: ChatSession, gen: Generation, params: SamplingParams) -> None:
        """Ask for the next round of ``gen``'s reply (the first: the answer to its question;
        later ones after the tool results)."""
        entry = gen.entry
        assert entry is not None and gen.parent is not None
        upto = entry if entry.steps else gen.parent
        offered = gen.tools if gen.tool_choice != "none" else []
        rid = self.submit(
            session, upto, params, tools=functions(offered) or None, tool_choice=gen.tool_choice
        )
        gen.request_ids.append(rid)

    def ask(self, session: ChatSession, question: Entry) -> None:
        """Ask for a reply to `question` (a new version of the turn after it), as one reply
        or as alternatives (the next-reply mode)."""
        mode = session.alt_mode
        self.fit(session, question)
        if mode.kind == "off":
            self.tool_loop.reply(session, question)
            return
        if mode.kind == "compare":
            self._compare(session, question, mode)
            return
        if mode.kind == "samples":
            params = session.sampling.params(n=mode.k)
        else:
            params = session.sampling.params(beam_width=mode.k)
        rid = self.submit(session, question, params)
        noun = "sample" if mode.kind == "samples" else "beam"
        gen = Generation(
            mode.kind,
            [rid],
            parent=question,
            candidates=[Candidate(f"{noun} {i + 1}", rid, i) for i in range(mode.k)],
        )
        session.alt_mode = AltMode(k=mode.k)  # one reply only: back to single replies
        session.changed(SettingsChanged())
        self._offer(session, gen)

    def continue_reply(self, session: ChatSession, reply: Entry) -> None:
        """Let ``reply`` (the last on show, checked by `Chats.continue_reply`) go on from where
        it ended: its text, thinking and stats so far are kept and added to."""
        self.fit(session, reply)
        before = reply.stats if reply.stats is not None else ReplyStats()
        rid = self.submit(session, reply, session.sampling.params(), continue_reply=True)
        reply.status = MessageStatus.STREAMING
        reply.stats = replace(before)
        session.changed(EntryUpdated(reply))
        gen = Generation(
            "reply",
            [rid],
            entry=reply,
            parent=reply.parent,
            continued=before,
            base_text=reply.content,
            base_reasoning=reply.reasoning,
            base_ids=reply.token_ids,
        )
        self.start(session, gen)

    def thinking_switch(self) -> str:
        """The switch of the model's chat template that /think sets (ChatError: none)."""
        if not self.client.ready:
            raise ChatError("the model is not ready yet: /think needs its chat template")
        switch = self.client.thinking_switch
        if switch is None:
            raise ChatError(
                f"{self.client.model_name} has no thinking switch in its chat template (no "
                "enable_thinking; over --backend the server's template is not seen): /think "
                "cannot turn its thinking on or off"
            )
        return switch

    def _compare(self, session: ChatSession, question: Entry, mode: AltMode) -> None:
        """The reply to ``question`` once per value of ``mode``'s setting, side by side."""
        settings = [session.sampling.with_value(mode.setting, raw) for raw in mode.values]
        labels = compare_labels(session.sampling, mode.setting, list(mode.values))
        gen = Generation("compare", [], parent=question)
        for label, setting in zip(labels, settings, strict=True):
            rid = self.submit(session, question, setting.params())
            gen.request_ids.append(rid)
            gen.candidates.append(Candidate(label, rid, 0))
            session.alt_mode = AltMode(k=mode.k)  # one comparison: back to single replies
        session.changed(SettingsChanged())
        self._offer(session, gen)

    def _offer(self, session: ChatSession, gen: Generation) -> None:
        """Alternatives for the turn after `gen.parent`: no version of it is on show until
        one is kept."""
        session.transcript.hide_after(gen.parent)
        session.changed(PathChanged())
        self.start(session, gen)

    def start(self, session: ChatSession, gen: Generation) -> None:
        session.generation = gen
        if gen.alternatives:
            session.changed(GenerationChanged())
        session.changed(BusyChanged())

    def drop(self, session: ChatSession) -> None:
        gen = session.generation
        if gen is None:
            return
        for rid in gen.request_ids:
            self._by_request.pop(rid, None)
            self._outputs.forget(rid)
            if rid not in gen.finished_requests:
                self.client.cancel(rid)
        session.generation = None
        for run in gen.entry.steps[-1].runs if gen.entry is not None and gen.entry.steps else []:
            if not run.resolved:  # asked for or running: the turn is over
                run.state, run.result = "denied", "Stopped by the user before it finished."
        gen.tools_busy = False
        if gen.entry is not None and gen.entry.status == MessageStatus.STREAMING:
            gen.entry.status = MessageStatus.STOPPED
            session.changed(EntryUpdated(gen.entry))
        if gen.alternatives:
            session.transcript.unhide_after(gen.parent)
            session.changed(GenerationChanged())
            session.changed(PathChanged())
        session.changed(BusyChanged())


MAX_DRAFT_TEXTS = 4
"""The most earlier versions a reply drafts from (the latest ones)."""


def other_versions(upto: Entry) -> tuple[str, ...]:
    """The replies of the turn after ``upto`` in its other versions, which a new reply may
    repeat: the ones a regenerate replaces (the versions after ``upto``) and those after the
    other versions of ``upto`` itself (an edited question's earlier answers); the latest
    first."""
    replies = list(upto.replies.versions)
    if upto.fork is not None:
        replies += [r for q in upto.fork.versions if q is not upto for r in q.replies.versions]
    texts = [r.content for r in reversed(replies) if r.role == "assistant" and r.content]
    return tuple(texts[:MAX_DRAFT_TEXTS])
