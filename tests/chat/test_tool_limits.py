"""What MCP tools bring into a chat is bounded, over the real engine (a tiny random model, a
1024-token window) and real stdio MCP servers written here with the `mcp` SDK: a result far
larger than the window is cut to what the context has left after the reply's max tokens, with
"[truncated N characters]", and only that is shown, saved and sent (the model answers instead
of the turn failing on its context); a server that never answers ``initialize`` fails at the
start's deadline with a notice, the chat answers without it, and /quit ends its process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import alive, make_app, mute_server, ready, send, tiny_run, wait_for, write_persona

from chatpage.config.mcp import McpServerConfig

pytestmark = pytest.mark.slow  # MCP servers in processes of their own

SIZE = (140, 44)
BIG = """
from typing import Literal
from mcp.server.mcpserver import MCPServer

app = MCPServer("big")

@app.tool()
def dump(part: Literal[1]) -> str:
    \"\"\"The whole log.\"\"\"
    return "\\n".join(f"line {i}: the quick brown fox" for i in range(20000))

app.run()
"""


def persona(directory: Path, server: str, choice: str) -> Path:
    write_persona(directory, "alpha", 40, f"tools: [{server}]\ntool_choice: {choice}\n")
    return directory


async def test_a_result_larger_than_the_context_is_cut_to_fit_shown_saved_and_answered(
    tiny_llama_dir, tmp_path
):
    script = tmp_path / "big_server.py"
    script.write_text(BIG)
    configs = {"big": McpServerConfig("big", sys.executable, (str(script),))}
    personas = persona(tmp_path / "personas", "big", "dump")
    async with tiny_run(tiny_llama_dir, personas, SIZE, mcp_servers=configs) as (app, pilot):
        await send(pilot, "what does the log say?")
        session = app.chat.current

        def asked():
            entry = session.entries[-1]
            return entry.steps and entry.steps[0].runs[0].state == "asking"

        await wait_for(pilot, asked, "the call asked for", 90)
        run = session.entries[-1].steps[0].runs[0]
        app.chats.requests.tool_loop.answer(session, run, "y")
        await wait_for(pilot, lambda: not session.streaming, "the answer after the result", 90)
        whole = len("\n".join(f"line {i}: the quick brown fox" for i in range(20000)))
        assert run.state == "done"
        kept, _, marker = run.result.rpartition("\n")
        assert marker == f"[truncated {whole - len(kept)} characters]"
        assert 0 < len(kept) < 1024 * 4
        reply = session.entries[-1]
        assert reply.status == "done", reply.error  # (before: the context refused the round)
        assert reply.stats.prompt_tokens + 40 <= 1024
        sent = [m["content"] for m in session.for_model() if m["role"] == "tool"]
        assert sent == [run.result]  # what the model was sent
        app.saved.recorder.flush(force=True)
        meta = app.store.messages(session.store_id)[-1].metadata
        assert meta["tool_steps"][0]["calls"][0]["result"] == run.result


async def test_a_server_that_never_answers_fails_at_its_deadline_and_the_chat_goes_on(
    tiny_llama_dir, tmp_path
):
    config, pid_file = mute_server(tmp_path)
    personas = persona(tmp_path / "personas", "mute", "auto")
    app = make_app(tiny_llama_dir, personas, mcp_servers={"mute": config})
    app.tools.start_timeout_s = 3
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await send(pilot, "hello")
        session = app.chat.current
        await wait_for(pilot, lambda: not session.streaming, "the answer without the tools", 90)
        assert "error: MCP server 'mute' could not start: no answer in 3 s" in app.notices
        assert session.entries[-1].status == "done"
        pid = int(pid_file.read_text())
        await wait_for(pilot, lambda: not alive(pid), "its process ended", 30)


async def test_quit_while_a_server_starts_ends_its_process(tiny_llama_dir, tmp_path):
    config, pid_file = mute_server(tmp_path)
    personas = persona(tmp_path / "personas", "mute", "auto")
    servers = {"mute": config}
    async with tiny_run(tiny_llama_dir, personas, SIZE, mcp_servers=servers) as (app, pilot):
        await send(pilot, "hello")
        await wait_for(pilot, lambda: pid_file.exists() and pid_file.read_text(), "its pid", 60)
        pid = int(pid_file.read_text())
        await send(pilot, "/quit")
    assert not alive(pid)
