"""The MCP manager against real servers written here with the `mcp` SDK: a stdio server killed
while idle is reported when it dies (the watcher's ping), not at the next call; a streamable-HTTP
server configured by URL lists and runs its tools, and its going away is reported too; a server
that never answers ``initialize`` (and ignores SIGTERM) fails at the start's one deadline, and
its process ends then, or when the servers are closed while it starts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from helpers import alive, mute_server

from chatpage.chat.mcp import McpServers, ServerState
from chatpage.config.mcp import McpServerConfig

pytestmark = pytest.mark.slow  # MCP servers in processes of their own

SERVER = """
import os, sys
from mcp.server.mcpserver import MCPServer

app = MCPServer("echo")

@app.tool()
def shout(text: str) -> str:
    \"\"\"Say it louder.\"\"\"
    return text.upper()

open(sys.argv[1], "w").write(str(os.getpid()))
if len(sys.argv) > 2:
    app.run("streamable-http", port=int(sys.argv[2]))
else:
    app.run()
"""


async def until(check, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "echo_server.py"
    path.write_text(SERVER)
    return path


@contextmanager
def http_server(script: Path, pid_file: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script), str(pid_file), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "no HTTP server"
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.kill()
        proc.wait()


async def test_a_stdio_server_killed_while_idle_is_reported_when_it_dies(script, tmp_path):
    pid_file, notices = tmp_path / "pid", []
    config = McpServerConfig("echo", sys.executable, (str(script), str(pid_file)))
    servers = McpServers({"echo": config}, notices.append, tmp_path / "logs", watch_s=0.2)
    try:
        await servers.start(["echo"])
        assert servers.servers["echo"].state == ServerState.RUNNING, servers.servers["echo"].why
        (tool,) = servers.tools(["echo"])
        assert (await servers.call(tool, '{"text": "hi"}')).text == "HI"
        assert notices == []
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        await until(lambda: notices, "the notice")
        assert servers.servers["echo"].state == ServerState.FAILED
        assert notices[0].startswith("MCP server 'echo' stopped: ")
        assert "\n" not in notices[0]
    finally:
        await servers.close()


async def test_a_server_by_url_lists_and_runs_its_tools_and_its_end_is_reported(script, tmp_path):
    notices: list[str] = []
    with http_server(script, tmp_path / "pid") as (url, proc):
        config = McpServerConfig("web", url=url)
        servers = McpServers({"web": config}, notices.append, watch_s=0.2)
        try:
            await servers.start(["web"])
            assert servers.servers["web"].state == ServerState.RUNNING, servers.servers["web"].why
            (tool,) = servers.tools(["web"])
            assert tool.name == "shout" and tool.parameters["required"] == ["text"]
            result = await servers.call(tool, '{"text": "over http"}')
            assert (result.text, result.error) == ("OVER HTTP", False)
            proc.kill()
            proc.wait()
            await until(lambda: notices, "the notice")
            assert notices[0].startswith("MCP server 'web' stopped: ")
            after = await servers.call(tool, '{"text": "again"}')
            assert after.error and "not running" in after.text
        finally:
            await servers.close()


async def test_a_server_that_never_answers_initialize_fails_at_the_deadline_and_ends(tmp_path):
    config, pid_file = mute_server(tmp_path)
    notices: list[str] = []
    servers = McpServers({"mute": config}, notices.append, tmp_path / "logs", start_timeout_s=3)
    try:
        await asyncio.wait_for(servers.start(["mute"]), 60)  # (before: waited for ever)
        server = servers.servers["mute"]
        assert server.state == ServerState.FAILED and servers.tools(["mute"]) == []
        assert notices == ["MCP server 'mute' could not start: no answer in 3 s"]
        pid = int(pid_file.read_text())
        assert server.task is not None
        await asyncio.wait_for(asyncio.shield(server.task), 30)  # the SDK's shutdown
        assert not alive(pid)
    finally:
        await servers.close()


async def test_closing_while_a_server_starts_ends_its_process(tmp_path):
    config, pid_file = mute_server(tmp_path)
    servers = McpServers({"mute": config}, start_timeout_s=600)
    starting = asyncio.create_task(servers.start(["mute"]))
    await until(pid_file.exists, "the server's process")
    await until(lambda: pid_file.read_text(), "its pid")
    pid = int(pid_file.read_text())
    await asyncio.wait_for(servers.close(), 60)
    assert not alive(pid)
    await asyncio.wait_for(starting, 10)  # and whoever waited on it goes on


async def test_a_stdio_servers_stderr_never_reaches_the_terminal(tmp_path, capfd):
    noisy = ("-c", "import sys; sys.stderr.write('NOISE from the server\\n'); sys.exit(3)")
    for log_dir in (None, tmp_path / "logs"):
        notices: list[str] = []
        servers = McpServers(
            {"noisy": McpServerConfig("noisy", sys.executable, noisy)}, notices.append, log_dir
        )
        try:
            await servers.start(["noisy"])
        finally:
            await servers.close()
        assert servers.servers["noisy"].state == ServerState.FAILED
        assert len(notices) == 1 and notices[0].startswith("MCP server 'noisy' could not start")
        assert "NOISE" not in capfd.readouterr().err  # (it would draw over the TUI)
    assert "NOISE from the server" in notices[0]  # the log's last line says why
