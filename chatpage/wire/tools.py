"""Tool fields of a chat request: ``tools`` (function tools with JSON-schema parameters),
``tool_choice`` (``none``, ``auto``, ``required`` or a named function), ``parallel_tool_calls``,
and the tool conversation in ``messages`` (assistant ``tool_calls``, ``tool`` results).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from chatpage.engine.text.tool_calls import forced_tools
from chatpage.wire.errors import ApiError, bad_value
from chatpage.wire.structured import check_schema, check_size

TOOL = "tool"
"""The role of a tool's result in the history."""
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHOICES = ("none", "auto", "required")


@dataclass
class ToolRequest:
    """The tools a request offers and how the model must use them: ``choice`` is one of
    `CHOICES` or the name of the function it must call."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str = "auto"
    parallel: bool = True

    @property
    def offered(self) -> bool:
        """The model sees tools and its reply is read for calls."""
        return bool(self.tools) and self.choice != "none"

    @property
    def forced(self) -> list[dict[str, Any]]:
        """The tools a grammar makes the reply call (none: the model chooses)."""
        return forced_tools(self.tools, self.choice)

    def fields(self) -> dict[str, Any]:
        """The request body's fields that say this (what `read_tools` reads back)."""
        choice: Any = self.choice
        if choice not in CHOICES:
            choice = {"type": "function", "function": {"name": choice}}
        return {"tools": self.tools, "tool_choice": choice}


def _tool(raw: Any, i: int) -> dict[str, Any]:
    where = f"tools[{i}]"
    if (
        not isinstance(raw, dict)
        or raw.get("type") != "function"
        or not isinstance(raw.get("function"), dict)
    ):
        raise bad_value(where, 'a function tool: {"type": "function", "function": {...}}', raw)
    fn = raw["function"]
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise bad_value(f"{where}.function.name", "1 to 64 letters, digits, _ or -", name)
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise bad_value(f"{where}.function.description", "a string", fn["description"])
    clean: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if fn.get(key) is not None:
            clean[key] = fn[key]
    return {"type": "function", "function": clean}


def read_tools(body: dict[str, Any]) -> ToolRequest:
    """The tool fields of a chat request body; a 400 names a bad one."""
    raw = body.get("tools")
    if raw is not None and not isinstance(raw, list):
        raise bad_value("tools", "a list of function tools", raw)
    tools = [_tool(t, i) for i, t in enumerate(raw or [])]
    schemas = [(i, t["function"].get("parameters")) for i, t in enumerate(tools)]
    schemas = [(i, schema) for i, schema in schemas if schema is not None]
    # their size together first (a forced call's grammar holds them all), then each one
    check_size(sum(len(json.dumps(schema)) for _, schema in schemas), "tools")
    for i, schema in schemas:
        check_schema(schema, f"tools[{i}].function.parameters")
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise ApiError(400, "tools must have distinct function names", "tools")
    choice = body.get("tool_choice")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        if (
            choice.get("type") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise bad_value(
                "tool_choice",
                'none, auto, required or {"type": "function", "function": {"name": ...}}',
                choice,
            )
        choice = fn["name"]
        if choice not in names:
            raise ApiError(
                400,
                f"tool_choice names the function {choice!r}, which is not among tools",
                "tool_choice",
            )
    elif choice not in CHOICES:
        raise bad_value("tool_choice", "none, auto, required or a named function", choice)
    if choice == "required" and not tools:
        raise ApiError(400, "tool_choice required needs tools", "tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise bad_value("parallel_tool_calls", "true or false", parallel)
    return ToolRequest(tools, choice, parallel)


def tool_calls_of(m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls``, checked (arguments stay JSON text)."""
    raw = m.get("tool_calls")
    if not isinstance(raw, list) or not raw:
        raise bad_value(f"{where}.tool_calls", "a non-empty list of function calls", raw)
    calls = []
    for j, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", ""), str | dict)
        ):
            raise bad_value(
                f"{where}.tool_calls[{j}]",
                '{"id": ..., "type": "function", "function": {"name": ..., "arguments": "..."}}',
                c,
            )
        calls.append(
            {
                "id": str(c.get("id") or f"call_{j}"),
                "type": "function",
                "function": {"name": fn["name"], "arguments": fn.get("arguments", "")},
            }
        )
    return calls
