"""MCP tools in the TUI over the real engine (a tiny random model) and a real stdio MCP server
written here with the `mcp` SDK: a call is asked for, approved, run, shown and fed back; a
denied call is not run; a server that fails to start or dies is a notice and the chat goes on.
The random model makes its call because the persona names the tool (``tool_choice``): the
engine's grammar forces a valid one."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from helpers import PROMPT_BODY, make_app, opened, ready, send, tiny_run, wait_for

from chatpage.config.mcp import McpServerConfig
from chatpage.ui.screens.tool_approval import ToolApproval
from chatpage.ui.screens.tools_list import ToolsList
from chatpage.ui.widgets.session_list import SessionList
from chatpage.ui.widgets.tool_block import ToolBlock

SIZE = (140, 44)
SERVER = """
import os, sys
from typing import Literal
from mcp.server.mcpserver import MCPServer

app = MCPServer("calc")

@app.tool()
def add(a: Literal[1, 2, 3], b: Literal[1, 2, 3]) -> int:
    \\"\\"\\"Add two small numbers.\\"\\"\\"
    with open(sys.argv[1], "a") as f:
        f.write(f"{a}+{b}\\\\n")
    return a + b

@app.tool()
def die(code: Literal[3]) -> str:
    \\"\\"\\"Exit at once.\\"\\"\\"
    os._exit(code)

app.run()
"""


def tool_persona(directory: Path, choice: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "alpha.yaml").write_text(
        "name: alpha\ndescription: calls tools\ntemperature: 0\nmax_tokens: 40\n"
        f"tools: [calc, broken]\ntool_choice: {choice}\n"
        f"system_prompt: You add numbers with the tools. {PROMPT_BODY * 2}\n"
    )
    return directory


def servers(tmp_path: Path) -> tuple[dict[str, McpServerConfig], Path]:
    script, calls = tmp_path / "calc_server.py", tmp_path / "calls.txt"
    script.write_text(SERVER.replace('\\"', '"').replace("\\\\n", "\\n"))
    return {
        "calc": McpServerConfig("calc", sys.executable, (str(script), str(calls))),
        "broken": McpServerConfig("broken", sys.executable, ("-c", "import sys; sys.exit(3)")),
    }, calls


async def asked(pilot, app, question: str):
    """Once the app is ready: ``question`` sent, and its first tool call asked for."""
    await ready(pilot, app)
    await send(pilot, question)
    # (its servers start first: two Python processes importing the SDK, slow on a busy machine)
    await wait_for(pilot, lambda: isinstance(app.screen, ToolApproval), "the question", 90)
    await answering(pilot, app)
    return app.chat.current


async def answering(pilot, app) -> None:
    """Once the approval dialog is up and takes answers (no key came for its quiet moment)."""
    await opened(pilot, ToolApproval)
    await wait_for(pilot, lambda: app.screen.answering, "the dialog to take answers")


@pytest.mark.slow  # MCP servers in processes of their own
async def test_a_call_is_asked_for_run_shown_fed_back_and_saved(tiny_llama_dir, tmp_path):
    configs, calls = servers(tmp_path)
    app = make_app(tiny_llama_dir, tool_persona(tmp_path / "personas", "add"), mcp_servers=configs)
    async with app.run_test(size=SIZE) as pilot:
        session = await asked(pilot, app, "what is 1 + 2?")
        assert any("'broken' could not start" in n for n in app.notices)  # and the chat goes on
        run = session.entries[-1].steps[0].runs[0]
        assert run.name == "add" and run.state == "asking" and not calls.exists()
        await pilot.press("y")
        await wait_for(pilot, lambda: not session.streaming, "the answer after the call")
        reply = session.entries[-1]
        a, b = json.loads(run.arguments).values()
        assert run.state == "done" and run.result == str(a + b) and run.elapsed_s > 0
        assert calls.read_text() == f"{a}+{b}\n"
        assert reply.status == "done" and reply.stats.tokens > 0  # the round after the result
        sent = session.for_model()
        assert sent[2]["tool_calls"][0]["function"]["name"] == "add"
        assert sent[3] == {"role": "tool", "content": str(a + b), "tool_call_id": run.id}

        block = app.chat.query(ToolBlock).first()  # shown folded; a click opens it
        assert "tool add · done" in str(block.query_one(".tool-head").render())
        await pilot.click(ToolBlock)
        assert f"result: {a + b}" in str(block.query_one(".tool-body").render())

        await send(pilot, "/tools")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsList), "/tools")
        listing = str(app.screen.query_one("#tools-listing").render())
        assert "calc (this chat) · running" in listing and "- calc/add" in listing
        assert "broken (this chat) · failed" in listing
        await pilot.press("escape")
        app.saved.recorder.flush(force=True)
        meta = app.store.messages(session.store_id)[-1].metadata
        assert meta["tool_steps"][0]["calls"][0]["result"] == str(a + b)


@pytest.mark.slow  # MCP servers in processes of their own
async def test_a_denied_call_is_not_run_and_a_server_that_dies_is_reported(
    tiny_llama_dir, tmp_path
):
    configs, calls = servers(tmp_path)
    app = make_app(tiny_llama_dir, tool_persona(tmp_path / "personas", "add"), mcp_servers=configs)
    async with app.run_test(size=SIZE) as pilot:
        session = await asked(pilot, app, "what is 1 + 2?")
        await pilot.press("n")
        await wait_for(pilot, lambda: not session.streaming, "the answer without the call")
        run = session.entries[-1].steps[0].runs[0]
        assert run.state == "denied" and not calls.exists()
        assert session.for_model()[3]["content"].startswith("The user did not allow")

        session.persona = replace(session.persona, tool_choice="die")
        await send(pilot, "now die")
        await answering(pilot, app)
        await pilot.press("a")
        await answering(pilot, app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not session.streaming, "the answer after the failure")
        run = session.entries[-1].steps[0].runs[0]
        assert run.state == "failed" and ("calc", "die") in session.always_tools
        assert any("MCP server 'calc' stopped" in n for n in app.notices), (app.notices, run)
        assert session.entries[-1].status == "done"  # the model was told, and answered


def two_calcs(tmp_path: Path) -> tuple[Path, dict[str, McpServerConfig]]:
    """Personas alpha (MCP server calc) and beta (calc2: the same tools, another server)."""
    configs, _ = servers(tmp_path)
    calc = configs["calc"]
    personas = tmp_path / "personas"
    personas.mkdir()
    for name, server in (("alpha", "calc"), ("beta", "calc2")):
        (personas / f"{name}.yaml").write_text(
            f"name: {name}\ndescription: calls tools\ntemperature: 0\nmax_tokens: 40\n"
            f"tools: [{server}]\ntool_choice: add\n"
            f"system_prompt: You are {name}; you add numbers with the tools. {PROMPT_BODY}\n"
        )
    return personas, {"calc": calc, "calc2": replace(calc, name="calc2")}


def asking(session) -> list:
    """The calls of the chat's last reply that wait for an answer."""
    entry = session.entries[-1]
    return [r for r in (entry.steps[-1].runs if entry.steps else []) if r.state == "asking"]


def sidebar_line(app, session) -> str:
    return str(app.chat.query_one(SessionList).get_option(str(session.id)).prompt)


@pytest.mark.slow  # MCP servers in processes of their own
async def test_a_call_in_another_chat_never_takes_the_typing(tiny_llama_dir, tmp_path, monkeypatch):
    """A call in a chat that is not on show marks it and says so; typing in the chat on show
    stays there (no dialog: before, "okay" answered "always"). Going to the chat asks; keys
    typed as the dialog opens go on to the message box; "always" takes a second key."""
    personas, configs = two_calcs(tmp_path)
    async with tiny_run(tiny_llama_dir, personas, SIZE, mcp_servers=configs) as (app, pilot):
        first = app.chat.current
        await send(pilot, "what is 1 + 2?")
        second = await app.chat.open_session(first.persona)
        await wait_for(pilot, lambda: asking(first), "the call", 90)
        (run,) = asking(first)
        await pilot.press(*"okay", "space", *"yes", "space", *"sure")
        assert app.chat.current is second and not isinstance(app.screen, ToolApproval)
        assert app.chat.prompt.text == "okay yes sure" and run.state == "asking"
        assert sidebar_line(app, first).startswith("?") and not first.always_tools
        assert any("asks to run the tool calc/add" in n for n in app.notices), app.notices

        monkeypatch.setattr(ToolApproval, "QUIET_S", 3600.0)  # keys as the dialog opens
        app.chat.current = first
        await opened(pilot, ToolApproval)
        title = str(app.screen.query_one(".dialog-title").render())
        assert "add (MCP server calc)" in title
        await pilot.press(*"yan", "enter", "escape")
        assert isinstance(app.screen, ToolApproval) and run.state == "asking"
        assert app.chat.prompt.text == "yan"  # what was typed is in this chat's box

        monkeypatch.setattr(ToolApproval, "QUIET_S", 0.0)
        await pilot.press("a")  # "always" asks for a second key
        assert isinstance(app.screen, ToolApproval) and run.state == "asking"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not first.streaming, "the answer after the call")
        assert run.state == "done" and ("calc", "add") in first.always_tools
        assert not sidebar_line(app, first).startswith("?")


@pytest.mark.slow  # MCP servers in processes of their own
async def test_always_is_for_one_server_and_one_persona(tiny_llama_dir, tmp_path):
    """ "Always" holds for calc's add in this chat; after /persona to a persona whose server
    calc2 has a tool of the same name, its call is asked for, naming its server."""
    personas, configs = two_calcs(tmp_path)
    app = make_app(tiny_llama_dir, personas, mcp_servers=configs)
    async with app.run_test(size=SIZE) as pilot:
        session = await asked(pilot, app, "what is 1 + 2?")
        await pilot.press("a")
        await answering(pilot, app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not session.streaming, "the answer after the call")

        await send(pilot, "and 2 + 3?")  # allowed for good: run without a question
        await wait_for(pilot, lambda: not session.streaming, "the second answer")
        assert not isinstance(app.screen, ToolApproval)
        assert [r.state for r in session.entries[-1].steps[0].runs] == ["done"]
        await send(pilot, "/tools")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolsList), "/tools")
        listing = str(app.screen.query_one("#tools-listing").render())
        assert "- calc/add (always allowed in this chat)" in listing
        await pilot.press("escape")

        await send(pilot, "/persona beta")
        await send(pilot, "and 3 + 3?")
        await wait_for(pilot, lambda: isinstance(app.screen, ToolApproval), "the question", 90)
        await opened(pilot, ToolApproval)
        run = session.entries[-1].steps[0].runs[0]
        assert run.state == "asking" and not session.always_tools
        assert "add (MCP server calc2)" in str(app.screen.query_one(".dialog-title").render())
        await answering(pilot, app)
        await pilot.press("n")
        await wait_for(pilot, lambda: not session.streaming, "the answer without the call")
        assert run.state == "denied"


ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


@pytest.mark.slow  # drives the app over an engine
async def test_a_persona_response_format_makes_every_reply_follow_its_schema(
    tiny_llama_dir, tmp_path
):
    """The random model's reply is JSON that validates, because the persona's schema file is
    the grammar of every reply (no MCP server involved)."""
    personas = tmp_path / "personas"
    personas.mkdir()
    (personas / "answer.json").write_text(json.dumps(ANSWER))
    (personas / "alpha.yaml").write_text(
        "name: alpha\ndescription: answers in JSON\ntemperature: 1.0\nmax_tokens: 60\n"
        f"response_format: answer.json\nsystem_prompt: You answer in JSON. {PROMPT_BODY}\n"
    )
    async with tiny_run(tiny_llama_dir, personas, SIZE) as (app, pilot):
        session = app.chat.current
        for question in ("is it raining?", "and tomorrow?"):
            await send(pilot, question)
            await wait_for(pilot, lambda: not session.streaming, "the reply")
            reply = session.entries[-1]
            assert reply.status == "done", reply
            jsonschema.validate(json.loads(reply.content), ANSWER)
