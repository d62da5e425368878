"""A reply's tool loop, the parts without the engine: which MCP tools a chat offers (its
persona's ``tools``), the grammar of a round (a forced call, or the persona's
``response_format``), and a reply's calls as a `ToolStep`.

A turn goes: the reply streams; when it ends with calls, its text and calls become a step, each
call is asked for (y / n / always for this server's tool in this chat), run on its MCP server,
and its result goes back to the model as a ``tool`` message; the model then continues. After
`MAX_CALLS` calls in a turn the next round offers no tools, so the model must answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from chatpage.chat.entry import ToolRun, ToolStep
from chatpage.chat.mcp import McpServers, McpTool
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.engine.sampling_params import GrammarKind, Structured
from chatpage.engine.text.grammar import grammar_text
from chatpage.engine.text.tool_calls import forced_tools
from chatpage.vocab import UserError

MAX_CALLS = 8
"""The most tool calls one turn may make; then the model must answer without tools."""
LIMIT = f"Not run: the limit of {MAX_CALLS} tool calls in one turn was reached; answer now."


class Call(Protocol):
    """A call the model made (the engine's `ToolCall`)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def arguments(self) -> str: ...


def server_names(persona: Persona, servers: McpServers) -> list[str]:
    """The MCP servers a chat with ``persona`` uses (unset ``tools``: every one configured)."""
    if persona.tools is None:
        return list(servers.servers)
    return list(dict.fromkeys(entry.split("/", 1)[0] for entry in persona.tools))


def unknown_servers(persona: Persona, servers: McpServers) -> list[str]:
    """The servers ``persona`` names that config.yaml does not define."""
    return [n for n in server_names(persona, servers) if n not in servers.servers]


def chat_tools(persona: Persona, servers: McpServers) -> list[McpTool]:
    """The tools offered to the model: those of ``persona``'s servers that run, narrowed to
    the tools it names (``server/tool``)."""
    tools = servers.tools(server_names(persona, servers))
    if persona.tools is None:
        return tools
    whole = {e for e in persona.tools if "/" not in e}
    named = {tuple(e.split("/", 1)) for e in persona.tools if "/" in e}
    return [t for t in tools if t.server in whole or (t.server, t.name) in named]


def round_grammar(persona: Persona, tools: Sequence[McpTool], choice: str) -> Structured | None:
    """The grammar of one round's text: the persona's response schema, unless ``choice``
    forces a call of ``tools`` (required, or a tool's name: the client constrains that one
    itself, `EngineClient.submit`'s ``tool_choice``); None: free text. A schema that does not
    compile is a `UserError` naming the persona's file."""
    if forced_tools(functions(tools), choice) or persona.response_schema is None:
        return None
    spec = Structured(GrammarKind.JSON_SCHEMA, persona.response_schema)
    try:
        grammar_text(spec)
    except ValueError as e:
        raise UserError(
            f"persona {persona.name!r}: response_format {persona.response_format} is not a "
            f"JSON schema chatpage can follow ({e}); fix the file"
        ) from None
    return spec


def calls_made(steps: Sequence[ToolStep]) -> int:
    return sum(len(s.runs) for s in steps)


def new_step(text: str, calls: Sequence[Call], before: int, tools: Sequence[McpTool]) -> ToolStep:
    """The step a reply's ``calls`` make (``before``: calls made earlier in the turn): calls
    past `MAX_CALLS`, and calls of tools not offered, are not run."""
    offered = {t.name for t in tools}
    step = ToolStep(text)
    for i, call in enumerate(calls):
        run = ToolRun(call.id, call.name, call.arguments)
        if before + i >= MAX_CALLS:
            run.state, run.result = "denied", LIMIT
        elif call.name not in offered:
            run.state, run.result = "failed", f"there is no tool named {call.name!r}"
        step.runs.append(run)
    return step


def tool_of(run: ToolRun, tools: Sequence[McpTool]) -> McpTool | None:
    return next((t for t in tools if t.name == run.name), None)


def asked_tool(session: ChatSession, run: ToolRun) -> McpTool | None:
    """The tool ``run`` (a call of the reply being written) calls: which server's."""
    gen = session.generation
    return None if gen is None else tool_of(run, gen.tools)


def always_allowed(session: ChatSession, tool: McpTool) -> bool:
    """Whether the user said "always" in ``session`` to this server's tool of this name as
    it is now (a tool of the same name on another server, or one its server now describes
    otherwise, is asked for again)."""
    return session.always_tools.get((tool.server, tool.name)) == tool


def allow_always(session: ChatSession, tool: McpTool) -> None:
    session.always_tools[(tool.server, tool.name)] = tool


def functions(tools: Sequence[McpTool]) -> list[dict[str, Any]]:
    """``tools`` as OpenAI function tools (what the chat template renders)."""
    return [t.function() for t in tools]
