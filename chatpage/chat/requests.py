"""Requests: what a chat asks of the engine and what comes back, the part of `Chats` that
talks to the `EngineClient`.

It never waits on the engine: `submit`/`cancel` only queue, and the client's updates come back
through `deliver` (the app posts them to its own thread) and are applied with `apply`, on the
UI thread. A reply is a new version of the turn after the message it answers; alternatives are
offered side by side (no version on show) until one is kept, and then all of them are versions.
Before anything is sent, `fit` leaves the oldest turns out if the chat outgrew the context.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
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
    ToolAsked,
)
from chatpage.chat.context import Fit, bound_result, fit, result_room
from chatpage.chat.entry import Entry, ReplyStats, ToolRun
from chatpage.chat.mcp import McpServers, ServerState
from chatpage.chat.replies import apply_candidate, apply_reply
from chatpage.chat.sampling import AltMode, SamplingSettings, setting_name
from chatpage.chat.session import Candidate, ChatSession, Generation
from chatpage.chat.tool_turns import (
    MAX_CALLS,
    allow_always,
    always_allowed,
    calls_made,
    chat_tools,
    functions,
    new_step,
    round_grammar,
    server_names,
    tool_of,
    unknown_servers,
)
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestUpdate
from chatpage.engine.protocol import EngineClient, UpdateCallback
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import FinishReason, MessageStatus, UserError


class ChatError(UserError):
    """Something the user asked for cannot be done now; the message is one line for them."""


class Requests:
    """A chat's requests to the engine. `notify` gets one-line notices (a turn that had to
    leave old messages out to fit the context, an MCP server that failed); ``tools``: the MCP
    servers whose tools a reply may call (`chatpage.chat.tool_turns`)."""

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
        self.tools = tools if tools is not None else McpServers({}, notify)
        self._by_request: dict[str, ChatSession] = {}
        self._outputs = OutputAccumulator()  # what each request in flight has said so far
        self._tasks: set[asyncio.Task[None]] = set()  # servers starting, calls running
        self._warned: set[str] = set()  # personas whose unknown servers were named once

    def stop(self, session: ChatSession) -> bool:
        """Cancel what is streaming; the engine frees its blocks and ends it with ABORT."""
        gen = session.generation
        if gen is None or not gen.streaming:
            return False
        if gen.tools_busy and len(gen.finished_requests) == len(gen.request_ids):
            self._drop_generation(session)  # tools asked for, running or starting: no request
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
        self._drop_generation(session)
        kept = _candidate_entry(chosen, self.client.model_name)
        for cand in gen.candidates:
            if cand.error and cand is not chosen:
                continue
            entry = kept if cand is chosen else _candidate_entry(cand, self.client.model_name)
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
            if apply_reply(session, gen, gen.entry, update, out) and not self._called(
                session, gen, out.outputs[0].tool_calls if out.outputs else []
            ):
                session.generation = None
                session.changed(BusyChanged())
            return session
        apply_candidate(session, gen, update, out)
        if not gen.streaming:
            if all(c.error for c in gen.candidates):
                self._drop_generation(session)
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
    def _check_idle(self, session: ChatSession) -> None:
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

    def _fit(self, session: ChatSession, upto: Entry | None, notice: bool = True) -> Fit:
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

    def _submit(
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
        return self.client.submit(
            session.for_model(upto=upto),
            params,
            self.deliver,
            continue_reply=continue_reply,
            reply_ids=session.reply_ids(self.client.model_name, upto),
            thinking=session.thinking,
            tools=tools,
            tool_choice=tool_choice,
        )

    def _ask(self, session: ChatSession, question: Entry) -> None:
        """Ask for a reply to `question` (a new version of the turn after it), as one reply
        or as alternatives (the next-reply mode)."""
        mode = session.alt_mode
        self._fit(session, question)
        if mode.kind == "off":
            self._reply(session, question)
            return
        if mode.kind == "compare":
            self._compare(session, question, mode)
            return
        if mode.kind == "samples":
            params = session.sampling.params(n=mode.k)
        else:
            params = session.sampling.params(beam_width=mode.k)
        rid = self._submit(session, question, params)
        noun = "sample" if mode.kind == "samples" else "beam"
        gen = Generation(
            mode.kind,
            [rid],
            parent=question,
            candidates=[Candidate(f"{noun} {i + 1}", rid, i) for i in range(mode.k)],
        )
        session.alt_mode = AltMode(k=mode.k)  # one reply only: back to single replies
        session.changed(SettingsChanged())
        self._by_request[rid] = session
        self._offer(session, gen)

    # -- a reply and its tool loop -------------------------------------------------------------
    def _reply(self, session: ChatSession, question: Entry) -> None:
        """One reply to ``question``; with MCP tools, the servers it needs start first (off
        the UI's way: the reply shows as streaming meanwhile)."""
        names = server_names(session.persona, self.tools)
        self._warn_unknown(session)
        starting = [
            n
            for n in names
            if n in self.tools.servers
            and self.tools.servers[n].state in (ServerState.NOT_STARTED, ServerState.STARTING)
        ]
        gen = Generation("reply", [], parent=question, tool_choice=session.persona.tool_choice)
        params = None
        if not starting:
            gen.tools = chat_tools(session.persona, self.tools)
            params = self._round_params(session, gen)  # (a bad schema: before any entry)
        entry = Entry(
            "assistant",
            "",
            status=MessageStatus.STREAMING,
            stats=ReplyStats(),
            token_source=self.client.model_name,
        )
        gen.entry = entry
        forked = bool(question.replies.versions)
        session.transcript.attach(entry, question)
        session.changed(EntryAdded(entry))
        if forked:
            session.changed(PathChanged())
        if params is not None:
            self._round(session, gen, params)
            self._start(session, gen)
            return
        gen.tools_busy = True
        self._start(session, gen)
        self._spawn(self._start_servers(session, gen, starting))

    async def _start_servers(self, session: ChatSession, gen: Generation, names: list[str]) -> None:
        await self.tools.start(names)
        gen.tools_busy = False
        if session.generation is not gen:  # stopped meanwhile
            return
        gen.tools = chat_tools(session.persona, self.tools)
        self._ask_round(session, gen)

    def _ask_round(self, session: ChatSession, gen: Generation) -> None:
        """The next round, or the reply fails where its persona's schema does not compile."""
        try:
            params = self._round_params(session, gen)
        except UserError as e:
            self._fail_reply(session, gen, str(e))
            return
        self._round(session, gen, params)

    def _round_params(self, session: ChatSession, gen: Generation) -> SamplingParams:
        """The next round's sampling: a forced call, the persona's schema, or neither."""
        choice = gen.tool_choice if gen.tools else "none"
        structured = round_grammar(session.persona, gen.tools, choice)
        params = session.sampling.params()
        return params if structured is None else replace(params, structured=structured)

    def _round(self, session: ChatSession, gen: Generation, params: SamplingParams) -> None:
        """Ask for the next round of ``gen``'s reply (the first: the answer to its question;
        later ones after the tool results)."""
        entry = gen.entry
        assert entry is not None and gen.parent is not None
        upto = entry if entry.steps else gen.parent
        offered = gen.tools if gen.tool_choice != "none" else []
        rid = self._submit(
            session, upto, params, tools=functions(offered) or None, tool_choice=gen.tool_choice
        )
        gen.request_ids.append(rid)
        self._by_request[rid] = session

    def _called(self, session: ChatSession, gen: Generation, calls: list[Any]) -> bool:
        """The reply that just ended made ``calls``: they become a step of it and are asked
        for (True); False when it made none (or was stopped): the turn is over."""
        entry = gen.entry
        if not calls or entry is None or entry.status != MessageStatus.DONE:
            return False
        step = new_step(entry.content, calls, calls_made(entry.steps), gen.tools)
        entry.steps.append(step)
        entry.content, entry.token_ids = "", None
        entry.status = MessageStatus.STREAMING
        gen.tool_choice = "none" if calls_made(entry.steps) >= MAX_CALLS else "auto"
        gen.tools_busy = True
        session.changed(EntryUpdated(entry))
        for run in step.runs:
            if run.resolved:
                continue
            if self._always(session, gen, run):
                self._run_tool(session, gen, run)
            else:
                session.changed(ToolAsked(entry, run))
        self._next_round(session, gen)
        return True

    def answer_tool(self, session: ChatSession, run: ToolRun, answer: str) -> None:
        """The user's answer to a call asked for: ``y`` run it, ``n`` do not (the model is
        told), ``a`` run it and every later call of this server's tool in this chat (until
        the chat's persona changes)."""
        gen = session.generation
        if gen is None or gen.entry is None or run.state != "asking":
            return
        if answer == "n":
            run.state = "denied"
        else:
            tool = tool_of(run, gen.tools)
            if answer == "a" and tool is not None:
                allow_always(session, tool)
            self._run_tool(session, gen, run)
            for other in session.tool_questions:  # (after "a": the same tool's)
                if self._always(session, gen, other):
                    self._run_tool(session, gen, other)
        session.changed(EntryUpdated(gen.entry))
        self._next_round(session, gen)

    @staticmethod
    def _always(session: ChatSession, gen: Generation, run: ToolRun) -> bool:
        """Whether ``run`` calls a tool the user allowed for good in ``session``."""
        tool = tool_of(run, gen.tools)
        return tool is not None and always_allowed(session, tool)

    def _run_tool(self, session: ChatSession, gen: Generation, run: ToolRun) -> None:
        tool = tool_of(run, gen.tools)
        if tool is None:
            run.state, run.result = "failed", f"there is no tool named {run.name!r}"
            return
        run.state = "running"

        async def call() -> None:
            started = time.monotonic()
            result = await self.tools.call(tool, run.arguments)
            run.elapsed_s = time.monotonic() - started
            if run.state != "running":  # the turn was stopped meanwhile
                return
            text = self._bound_result(session, gen, result.text)
            run.state, run.result = ("failed" if result.error else "done"), text
            if session.generation is gen and gen.entry is not None:
                session.changed(EntryUpdated(gen.entry))
                self._next_round(session, gen)

        self._spawn(call())

    def _bound_result(self, session: ChatSession, gen: Generation, text: str) -> str:
        """A tool's result cut to what the context has left for it after the prompt so far,
        the tools offered and the reply's max tokens, shared with the calls of its step still
        running (`bound_result`): what is shown, saved and sent."""
        entry = gen.entry
        assert entry is not None and entry.steps
        outcome = self._fit(session, entry)
        waiting = sum(r.state == "running" for r in entry.steps[-1].runs)
        offered = functions(gen.tools) if gen.tool_choice != "none" else []
        room = result_room(outcome.needed, session.context_tokens, offered, waiting)
        return bound_result(text, room, self.client.counter)

    def _next_round(self, session: ChatSession, gen: Generation) -> None:
        """Once every call of the latest step is resolved, the model continues."""
        entry = gen.entry
        if session.generation is not gen or entry is None or not gen.tools_busy:
            return
        if not all(r.resolved for r in entry.steps[-1].runs):
            return
        gen.tools_busy = False
        self._ask_round(session, gen)

    def _fail_reply(self, session: ChatSession, gen: Generation, why: str) -> None:
        if gen.entry is not None:
            gen.entry.status, gen.entry.error = MessageStatus.ERROR, why
            session.changed(EntryUpdated(gen.entry))
        gen.tools_busy = False
        session.generation = None
        session.changed(BusyChanged())

    def _warn_unknown(self, session: ChatSession) -> None:
        persona = session.persona
        missing = unknown_servers(persona, self.tools)
        if missing and persona.name not in self._warned:
            self._warned.add(persona.name)
            self.notify(
                f"persona {persona.name!r} names MCP server {', '.join(missing)}, which "
                "config.yaml does not define under mcp_servers; its tools are left out"
            )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _compare(self, session: ChatSession, question: Entry, mode: AltMode) -> None:
        """The reply to ``question`` once per value of ``mode``'s setting, side by side."""
        settings = [session.sampling.with_value(mode.setting, raw) for raw in mode.values]
        labels = compare_labels(session.sampling, mode.setting, list(mode.values))
        gen = Generation("compare", [], parent=question)
        for label, setting in zip(labels, settings, strict=True):
            rid = self._submit(session, question, setting.params())
            gen.request_ids.append(rid)
            gen.candidates.append(Candidate(label, rid, 0))
            self._by_request[rid] = session
        session.alt_mode = AltMode(k=mode.k)  # one comparison: back to single replies
        session.changed(SettingsChanged())
        self._offer(session, gen)

    def _offer(self, session: ChatSession, gen: Generation) -> None:
        """Alternatives for the turn after `gen.parent`: no version of it is on show until
        one is kept."""
        session.transcript.hide_after(gen.parent)
        session.changed(PathChanged())
        self._start(session, gen)

    def _start(self, session: ChatSession, gen: Generation) -> None:
        session.generation = gen
        if gen.alternatives:
            session.changed(GenerationChanged())
        session.changed(BusyChanged())

    def _drop_generation(self, session: ChatSession) -> None:
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


def _candidate_status(cand: Candidate) -> MessageStatus:
    if cand.error is not None or cand.finish_reason is FinishReason.ERROR:
        return MessageStatus.ERROR
    if cand.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
        return MessageStatus.DONE
    return MessageStatus.STOPPED


def _candidate_entry(cand: Candidate, token_source: str | None) -> Entry:
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


def compare_labels(sampling: SamplingSettings, name: str, values: list[str]) -> list[str]:
    """The pane titles of a comparison of setting ``name`` (``temp=0.2``); ValueError names
    a value that is not allowed."""
    return [
        f"{setting_name(name)}={getattr(sampling.with_value(name, raw), name)}" for raw in values
    ]
