"""MCP servers: started with the official ``mcp`` SDK when a chat first needs their tools, their
tools listed, called, and shut down on exit.

Everything here runs on the app's asyncio loop (one task per server holds its connection open),
so nothing waits on a server on the UI's behalf. A server that cannot start, or that goes away,
is a state (`FAILED`, with why) and one notice, never an exception to the caller. A stdio
server's stderr goes to a file in the data dir (it would draw over the terminal), and its last
line says why the server stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from chatpage.config.mcp import McpServerConfig

START_TIMEOUT_S = 30.0
"""How long a server may take to start: its process spawned (or its URL reached), the
handshake (``initialize``) and its tools listed, all under this one deadline."""
CALL_TIMEOUT_S = 120.0
"""How long one tool call may take."""
CLOSE_TIMEOUT_S = 10.0
"""How long closing waits for the servers to end (the SDK closes a stdio server's stdin, waits
2 s, then ends its process group: SIGTERM, and SIGKILL 2 s later)."""
WATCH_S = 10.0
"""How often a running server is asked for its tools while idle, so one that died is reported when it dies,
not at the next call."""


class ServerState(enum.StrEnum):
    NOT_STARTED = "not started"
    STARTING = "starting"
    RUNNING = "running"
    FAILED = "failed"


@dataclass(frozen=True)
class McpTool:
    """One tool of a server: its name, description and JSON schema of its arguments."""

    server: str
    name: str
    description: str
    parameters: dict[str, Any]

    def function(self) -> dict[str, Any]:
        """As an OpenAI function tool (what the chat template and the grammar read)."""
        fn: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolResult:
    """What a call gave back, as text for the model; ``error``: the tool or the server failed."""

    text: str
    error: bool = False


@dataclass
class McpServer:
    """One configured server and where it stands."""

    config: McpServerConfig
    state: ServerState = ServerState.NOT_STARTED
    why: str = ""  # why it failed
    tools: list[McpTool] = field(default_factory=list)
    client: Any = None  # the SDK's Client while running
    task: asyncio.Task[None] | None = None
    scope: Any = None  # the anyio CancelScope around its connection (the start's deadline)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.config.name


class McpServers:
    """The servers of config.yaml. ``notify`` gets one-line notices (a server that failed);
    ``log_dir``: where stdio servers' stderr goes (None: discarded); ``watch_s``: how often a
    running server is asked for its tools (`WATCH_S`); ``start_timeout_s``: the deadline of a
    server's whole start (`START_TIMEOUT_S`)."""

    def __init__(
        self,
        configs: Mapping[str, McpServerConfig],
        notify: Callable[[str], None] = lambda _line: None,
        log_dir: Path | None = None,
        watch_s: float = WATCH_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.servers = {name: McpServer(config) for name, config in configs.items()}
        self.notify = notify
        self.log_dir = log_dir
        self.watch_s = watch_s
        self.start_timeout_s = start_timeout_s

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def start(self, names: Iterable[str]) -> None:
        """Start those of ``names`` not started yet, and wait until each runs or failed."""
        wanted = [self.servers[n] for n in names if n in self.servers]
        for server in wanted:
            if server.state == ServerState.NOT_STARTED:
                server.state = ServerState.STARTING
                server.task = asyncio.create_task(self._run(server), name=f"mcp {server.name}")
        await asyncio.gather(*(s.ready.wait() for s in wanted))

    def tools(self, names: Iterable[str]) -> list[McpTool]:
        """The tools of the running servers among ``names``, in order (a name a server
        before it already offers is left out)."""
        seen: set[str] = set()
        out = []
        for name in names:
            server = self.servers.get(name)
            if server is None or server.state != ServerState.RUNNING:
                continue
            for tool in server.tools:
                if tool.name not in seen:
                    seen.add(tool.name)
                    out.append(tool)
        return out

    async def call(self, tool: McpTool, arguments: str) -> ToolResult:
        """Call ``tool`` with ``arguments`` (JSON text of an object); a failure is a result
        with ``error``, and a server that went away is marked failed."""
        server = self.servers[tool.server]
        try:
            args = json.loads(arguments or "{}")
        except ValueError as e:
            return ToolResult(f"the arguments are not JSON: {e}", error=True)
        if not isinstance(args, dict):
            return ToolResult("the arguments must be a JSON object", error=True)
        if server.state != ServerState.RUNNING or server.client is None:
            return ToolResult(f"MCP server {server.name!r} is not running: {server.why}", True)
        try:
            result = await asyncio.wait_for(
                server.client.call_tool(tool.name, args), CALL_TIMEOUT_S
            )
        except TimeoutError:
            return ToolResult(f"no answer from {tool.name} in {CALL_TIMEOUT_S:g} s", error=True)
        except Exception as e:  # the server went away (connection closed, process gone)
            self._failed(server, _reason(e))
            return ToolResult(f"MCP server {server.name!r} failed: {server.why}", error=True)
        return ToolResult(_result_text(result), bool(result.is_error))

    async def close(self) -> None:
        """Shut every server down and wait until their stdio processes ended: a running one is
        asked to stop, one still starting is cancelled (the SDK's shutdown, shielded from the
        cancel, still ends its process)."""
        tasks = [s.task for s in self.servers.values() if s.task is not None]
        for server in self.servers.values():
            server.stop.set()
            if server.scope is not None and server.state != ServerState.RUNNING:
                server.scope.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
            for task in pending:
                task.cancel()

    # -- one server's connection ------------------------------------------------------------------
    async def _run(self, server: McpServer) -> None:
        import anyio  # (with the SDK, whose own cancel scopes these are)
        from mcp import Client  # the SDK's imports (~0.5 s): when a chat first needs a server

        log = self._log(server)
        # one deadline around the whole start (spawn, initialize, tools/list): then the server
        # failed at once, and its anyio scope is cancelled (the SDK's shutdown, shielded from
        # that, ends the process meanwhile)
        server.scope = anyio.CancelScope()
        deadline = asyncio.get_running_loop().call_later(
            self.start_timeout_s, self._too_slow, server, log
        )
        try:
            with server.scope:
                async with Client(self._transport(server, log)) as client:
                    server.tools = await self._listing(server, client)
                    deadline.cancel()
                    server.client, server.state = client, ServerState.RUNNING
                    server.ready.set()
                    await self._watch(server, client)
        except Exception as e:
            self._failed(server, _reason(e, log, self.start_timeout_s))
        finally:
            deadline.cancel()
            server.client = None
            server.ready.set()
            if log is not None:
                log.close()

    def _too_slow(self, server: McpServer, log: TextIO | None) -> None:
        """The start's deadline passed: the server failed, the chats waiting on it go on."""
        self._failed(server, _reason(TimeoutError(), log, self.start_timeout_s))
        server.ready.set()
        server.scope.cancel()

    async def _watch(self, server: McpServer, client: Any) -> None:
        """Until the server is to stop: its tools listed again every `watch_s` (a server that
        went away raises, and is reported then; one whose tools changed offers the new ones)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(server.stop.wait(), self.watch_s)
                return
            server.tools = await self._listing(server, client)

    async def _listing(self, server: McpServer, client: Any) -> list[McpTool]:
        listing = await asyncio.wait_for(client.list_tools(), self.start_timeout_s)
        return [
            McpTool(server.name, t.name, t.description or "", dict(t.input_schema))
            for t in listing.tools
        ]

    def _transport(self, server: McpServer, log: TextIO | None) -> Any:
        config = server.config
        if config.url is not None:
            return config.url
        assert log is not None  # (`_log` gives every stdio server one)
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=str(Path(config.command or "").expanduser()),
            args=list(config.args),
            env=dict(config.env) or None,
        )
        return stdio_client(params, errlog=log)

    def _log(self, server: McpServer) -> TextIO | None:
        """Where a stdio server's stderr goes: its log file, else nowhere (never the terminal,
        which it would draw over); None for a server by URL."""
        if server.config.url is not None:
            return None
        if self.log_dir is not None:
            with contextlib.suppress(OSError):
                self.log_dir.mkdir(parents=True, exist_ok=True)
                return open(self.log_dir / f"{server.name}.log", "w+", encoding="utf-8")  # noqa: SIM115
        return open(os.devnull, "w+", encoding="utf-8")  # noqa: SIM115

    def _failed(self, server: McpServer, why: str) -> None:
        if server.state == ServerState.FAILED:
            return
        was = server.state
        server.state, server.why, server.client = ServerState.FAILED, why, None
        server.stop.set()
        what = "could not start" if was == ServerState.STARTING else "stopped"
        self.notify(f"MCP server {server.name!r} {what}: {why}")


def _leaf(e: BaseException) -> BaseException:
    """The first error inside exception groups (the SDK's task groups wrap them)."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _reason(e: BaseException, log: TextIO | None = None, timeout_s: float = START_TIMEOUT_S) -> str:
    leaf = _leaf(e)
    text = str(leaf).strip() or type(leaf).__name__
    if isinstance(leaf, TimeoutError):
        text = f"no answer in {timeout_s:g} s"
    elif isinstance(leaf, FileNotFoundError):
        text = f"command not found: {leaf.filename}; fix its command in config.yaml"
    last = _last_line(log)
    return f"{text} ({last})" if last else text


def _last_line(log: TextIO | None) -> str:
    if log is None:
        return ""
    with contextlib.suppress(OSError, ValueError):
        log.flush()
        log.seek(0)
        lines = [line.strip() for line in log.read().splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""
    return ""


def _result_text(result: Any) -> str:
    """A call's content as text: text blocks as they are, anything else as JSON."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else block.model_dump_json())
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
