"""MCP servers in config.yaml: ``mcp_servers:`` maps a name to how the server is reached::

    mcp_servers:
      files:                      # a stdio server: chatpage starts the command
        command: npx
        args: ["-y", "@modelcontextprotocol/server-filesystem", "~/notes"]
        env: {LOG_LEVEL: error}   # optional, added to chatpage's environment
      search:                     # a streamable HTTP server, already running
        url: http://localhost:8931/mcp

A bad entry is one warning naming the server and what to fix; the other servers stay.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
"""A server's name: what personas' ``tools:`` and /tools call it."""
_STDIO_KEYS = ("command", "args", "env")
_EXAMPLE = "{command: CMD, args: [...], env: {...}} or {url: http://host:port/mcp}"


@dataclass(frozen=True)
class McpServerConfig:
    """One configured MCP server: a command to start (stdio) or a URL (streamable HTTP)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    url: str | None = None

    def describe(self) -> str:
        """How it is reached, on one line (``npx -y server``, ``http://...``)."""
        if self.url is not None:
            return self.url
        return " ".join((self.command or "", *self.args))


def _server(name: str, raw: Any) -> McpServerConfig:
    """One entry; ValueError says what to fix."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping, {_EXAMPLE}")
    unknown = sorted(str(k) for k in raw if k not in (*_STDIO_KEYS, "url"))
    if unknown:
        raise ValueError(f"unknown key {', '.join(unknown)}; use command, args and env, or url")
    if ("url" in raw) == ("command" in raw):
        raise ValueError("give either command (a stdio server) or url (a streamable HTTP server)")
    if "url" in raw:
        url = raw["url"]
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                "url must be an http:// or https:// address, e.g. http://host:8000/mcp"
            )
        if "args" in raw or "env" in raw:
            raise ValueError("args and env are for a command; a url server takes only url")
        return McpServerConfig(name, url=url.strip())
    command, args, env = raw["command"], raw.get("args") or [], raw.get("env") or {}
    if not isinstance(command, str) or not command.strip():
        raise ValueError("command must be the program to run, e.g. command: npx")
    if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
        raise ValueError("args must be a list of strings, e.g. args: [-y, some-server]")
    if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
        raise ValueError("env must be a mapping of variable to value, e.g. env: {DEBUG: '0'}")
    return McpServerConfig(
        name,
        command=command.strip(),
        args=tuple(str(a) for a in args),
        env={k: str(v) for k, v in env.items()},
    )


def parse_mcp_servers(
    value: Any, warn: Callable[[str], None], origin: str
) -> dict[str, McpServerConfig]:
    """``mcp_servers`` of config.yaml: the good entries; one warning per bad one."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"a mapping of server name to {_EXAMPLE}")
    servers: dict[str, McpServerConfig] = {}
    for name, raw in value.items():
        if not isinstance(name, str) or not SERVER_NAME.match(name):
            warn(
                f"{origin}: mcp_servers.{name}: the name must be 1 to 40 letters, digits, _ or -; "
                "rename it; skipped"
            )
            continue
        try:
            servers[name] = _server(name, raw)
        except ValueError as err:
            warn(f"{origin}: mcp_servers.{name}: {err}; skipped")
    return servers
