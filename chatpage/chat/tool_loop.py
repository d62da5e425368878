"""A reply and its tool loop: the MCP servers it needs started, each round asked for, the calls
a round ends with asked about, run and their results bounded to the context, until the model
answers without calls (the pure parts: `chatpage.chat.tool_turns`).

`ToolLoop` is held by `Requests`, which submits its rounds and hands it a reply that ended
with calls (`called`); the user's answers to the calls come through `answer`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import replace
from typing import Any, Protocol

from chatpage.chat.changes import BusyChanged, EntryAdded, EntryUpdated, PathChanged, ToolAsked
from chatpage.chat.context import Fit, bound_result, result_room
from chatpage.chat.entry import Entry, ReplyStats, ToolRun
from chatpage.chat.mcp import McpServers, ServerState
from chatpage.chat.session import ChatSession, Generation
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
from chatpage.engine.protocol import EngineClient
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import MessageStatus, UserError


class Rounds(Protocol):
    """What the loop needs of the requests that carry its rounds (`Requests`)."""

    client: EngineClient[object]
    notify: Callable[[str], None]

    def round(self, session: ChatSession, gen: Generation, params: SamplingParams) -> None: ...
    def fit(self, session: ChatSession, upto: Entry | None, notice: bool = True) -> Fit: ...
    def start(self, session: ChatSession, gen: Generation) -> None: ...


class ToolLoop:
    """The tool rounds of the replies of every chat; ``servers``: the MCP servers whose tools
    a reply may call."""

    def __init__(self, requests: Rounds, servers: McpServers) -> None:
        self.requests = requests
        self.servers = servers
        self._tasks: set[asyncio.Task[None]] = set()  # servers starting, calls running
        self._warned: set[str] = set()  # personas whose unknown servers were named once

    def reply(self, session: ChatSession, question: Entry) -> None:
        """One reply to ``question``; with MCP tools, the servers it needs start first (off
        the UI's way: the reply shows as streaming meanwhile)."""
        names = server_names(session.persona, self.servers)
        self._warn_unknown(session)
        starting = [
            n
            for n in names
            if n in self.servers.servers
            and self.servers.servers[n].state in (ServerState.NOT_STARTED, ServerState.STARTING)
        ]
        gen = Generation("reply", [], parent=question, tool_choice=session.persona.tool_choice)
        params = None
        if not starting:
            gen.tools = chat_tools(session.persona, self.servers)
            params = self._round_params(session, gen)  # (a bad schema: before any entry)
        entry = Entry(
            "assistant",
            "",
            status=MessageStatus.STREAMING,
            stats=ReplyStats(),
            token_source=self.requests.client.model_name,
        )
        gen.entry = entry
        forked = bool(question.replies.versions)
        session.transcript.attach(entry, question)
        session.changed(EntryAdded(entry))
        if forked:
            session.changed(PathChanged())
        if params is not None:
            self.requests.round(session, gen, params)
            self.requests.start(session, gen)
            return
        gen.tools_busy = True
        self.requests.start(session, gen)
        self._spawn(self._start_servers(session, gen, starting))

    async def _start_servers(self, session: ChatSession, gen: Generation, names: list[str]) -> None:
        await self.servers.start(names)
        gen.tools_busy = False
        if session.generation is not gen:  # stopped meanwhile
            return
        gen.tools = chat_tools(session.persona, self.servers)
        self._ask_round(session, gen)

    def _ask_round(self, session: ChatSession, gen: Generation) -> None:
        """The next round, or the reply fails where its persona's schema does not compile."""
        try:
            params = self._round_params(session, gen)
        except UserError as e:
            self._fail_reply(session, gen, str(e))
            return
        self.requests.round(session, gen, params)

    def _round_params(self, session: ChatSession, gen: Generation) -> SamplingParams:
        """The next round's sampling: a forced call, the persona's schema, or neither."""
        choice = gen.tool_choice if gen.tools else "none"
        structured = round_grammar(session.persona, gen.tools, choice)
        params = session.sampling.params()
        return params if structured is None else replace(params, structured=structured)

    def called(self, session: ChatSession, gen: Generation, calls: list[Any]) -> bool:
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

    def answer(self, session: ChatSession, run: ToolRun, answer: str) -> None:
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
            result = await self.servers.call(tool, run.arguments)
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
        outcome = self.requests.fit(session, entry)
        waiting = sum(r.state == "running" for r in entry.steps[-1].runs)
        offered = functions(gen.tools) if gen.tool_choice != "none" else []
        room = result_room(outcome.needed, session.context_tokens, offered, waiting)
        return bound_result(text, room, self.requests.client.counter)

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
        missing = unknown_servers(persona, self.servers)
        if missing and persona.name not in self._warned:
            self._warned.add(persona.name)
            self.requests.notify(
                f"persona {persona.name!r} names MCP server {', '.join(missing)}, which "
                "config.yaml does not define under mcp_servers; its tools are left out"
            )

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
