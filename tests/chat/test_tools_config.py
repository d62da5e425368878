"""mcp_servers in config.yaml and a persona's tools / tool_choice / response_format: good
values read, a bad one is one line naming it and what to fix."""

from __future__ import annotations

import json

import pytest

from chatpage.config.personas import InvalidPersona, load_persona_file, persona_yaml
from chatpage.config.settings import load_settings

PERSONA = "name: p\ndescription: d\nsystem_prompt: s\n"


def test_mcp_servers_read_and_a_bad_entry_is_one_line(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        "mcp_servers:\n"
        "  files: {command: npx, args: [-y, server-files, 3], env: {A: 1}}\n"
        "  web: {url: 'http://localhost:8931/mcp'}\n"
        "  both: {command: x, url: 'http://h/mcp'}\n"
        "  nothing: {args: [a]}\n"
        "  'bad name': {command: x}\n"
    )
    settings, warnings = load_settings(path)
    files, web = settings.mcp_servers["files"], settings.mcp_servers["web"]
    assert (files.command, files.args, dict(files.env)) == (
        "npx",
        ("-y", "server-files", "3"),
        {"A": "1"},
    )
    assert web.url == "http://localhost:8931/mcp" and set(settings.mcp_servers) == {"files", "web"}
    assert len(warnings) == 3 and all("\n" not in w for w in warnings)
    assert "mcp_servers.both: give either command" in warnings[0]
    assert "mcp_servers.nothing: give either command" in warnings[1]
    assert "mcp_servers.bad name: the name must be" in warnings[2]


def test_persona_tools_and_response_format(tmp_path):
    (tmp_path / "reply.json").write_text(json.dumps({"type": "object"}))
    path = tmp_path / "p.yaml"
    path.write_text(
        PERSONA + "tools: [files, web/search]\ntool_choice: required\nresponse_format: reply.json\n"
    )
    persona = load_persona_file(path)
    assert persona.tools == ("files", "web/search") and persona.tool_choice == "required"
    assert persona.response_format == (tmp_path / "reply.json").resolve()
    assert json.loads(persona.response_schema) == {"type": "object"}
    assert "response_format: " + str(persona.response_format) in persona_yaml(persona)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ("tools: files, web\n", "'tools' must be a list of MCP server names"),
        ("tool_choice: [x]\n", "'tool_choice' must be auto, none, required"),
        ("response_format: missing.json\n", "'response_format': cannot read"),
        ("response_format: bad.json\n", "is not JSON"),
    ],
)
def test_a_broken_tool_value_is_one_line(tmp_path, extra, needle):
    (tmp_path / "bad.json").write_text("{nope")
    path = tmp_path / "p.yaml"
    path.write_text(PERSONA + extra)
    with pytest.raises(InvalidPersona, match="^[^\n]*$") as err:
        load_persona_file(path)
    assert needle in str(err.value)
