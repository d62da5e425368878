"""Tool calls in a model's own format: the tools and the history into its chat template, its
reply parsed back into calls (whole or streamed), and the grammar that makes it call.

The family comes from the chat template (`tool_format`):
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call
  (Hermes, Qwen2.5/3 and most templates that render ``tools``); also chatpage's own format for a
  template that does not render tools at all (the tools go into the system prompt then).
- ``llama3_json``: a bare ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3); one call.
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``.

No Textual, no HTTP: `chatpage serve` uses it, and the TUI can.
"""

from __future__ import annotations

import enum
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from chatpage.engine.reasoning import partial_marker


class ToolFamily(enum.StrEnum):
    """The tool-call formats chatpage reads and writes."""

    HERMES = "hermes"
    LLAMA3 = "llama3_json"
    MISTRAL = "mistral"


HERMES, LLAMA3, MISTRAL = ToolFamily.HERMES, ToolFamily.LLAMA3, ToolFamily.MISTRAL
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL_MARK = "[TOOL_CALLS]"
_LLAMA_TAG = "<|python_tag|>"
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model made: the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=_call_id)


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """How one model family writes tool calls. ``renders_tools``: its chat template renders
    the ``tools`` variable (else chatpage writes them into the system prompt)."""

    family: ToolFamily
    renders_tools: bool = True

    @property
    def parallel(self) -> bool:
        """Whether the family allows several calls in one reply."""
        return self.family != LLAMA3

    def describe(self) -> str:
        """One line for the start-up log."""
        how = (
            "rendered by the chat template"
            if self.renders_tools
            else "the chat template does not render tools: chatpage lists them in the system prompt"
        )
        return f"tool calls: {self.family} format ({how})"

    # -- the prompt --------------------------------------------------------------------------------
    def prompt_messages(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """``messages`` (OpenAI's shape: assistant ``tool_calls`` with arguments as JSON text,
        ``tool`` results) as the chat template reads them: arguments as objects (transformers'
        convention); for a template that renders no tools, everything as plain text turns."""
        if self.renders_tools:
            return [_template_message(m) for m in messages]
        out = [_plain_message(m) for m in messages]
        if tools:
            listing = _tool_listing(tools)
            if out and out[0]["role"] == "system":
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + listing}
            else:
                out.insert(0, {"role": "system", "content": listing})
        return out

    # -- the reply ---------------------------------------------------------------------------------
    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(the content left, the calls) of a whole reply; text that is not a well-formed call
        stays content."""
        match self.family:
            case ToolFamily.HERMES:
                calls, spans = [], []
                for m in _HERMES_BLOCK.finditer(text):
                    call = _read_call(m.group(1), "arguments")
                    if call is not None:
                        calls.append(call)
                        spans.append(m.span())
                for start, end in reversed(spans):
                    text = text[:start] + text[end:]
                return (text.strip() if calls else text), calls
            case ToolFamily.MISTRAL:
                before, mark, after = text.partition(_MISTRAL_MARK)
                body = after if mark else text  # (the marker is a special token, often hidden)
                found = _read_calls(body.strip())
                if found is None:
                    return text, []
                return (before.strip() if mark else ""), found
            case _:
                body = text.strip().removeprefix(_LLAMA_TAG).strip()
                found = _read_calls(body, "parameters") if body.startswith(("{", "[")) else None
                return ("", found) if found else (text, [])

    def stream(self) -> ToolCallStream:
        return ToolCallStream(self)

    # -- the grammar ----------------------------------------------------------------------------------
    def grammar(
        self, tools: list[dict[str, Any]], parallel: bool, token_id: Callable[[str], int | None]
    ) -> str:
        """A Lark grammar (llguidance's, with embedded JSON schemas) of a reply that is only
        calls of ``tools`` (one, or several when ``parallel`` and the family allows), whose
        arguments follow each function's parameters schema. ``token_id``: a special token's
        id (Mistral's marker), None when the text is not one token."""
        key = "parameters" if self.family == LLAMA3 else "arguments"
        options = [
            {
                "type": "object",
                "properties": {"name": {"const": _function(t)["name"]}, key: _parameters(t)},
                "required": ["name", key],
                "additionalProperties": False,
            }
            for t in tools
        ]
        one: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
        many = parallel and self.parallel
        match self.family:
            case ToolFamily.HERMES:
                call = f'"{_HERMES_OPEN}\\n" %json {_schema(one)} "\\n{_HERMES_CLOSE}"'
                return f'start: call ("\\n" call)*\ncall: {call}' if many else f"start: {call}"
            case ToolFamily.MISTRAL:
                array = {"type": "array", "items": one, "minItems": 1}
                if not many:
                    array["maxItems"] = 1
                mark = token_id(_MISTRAL_MARK)
                head = f"<[{mark}]>" if mark is not None else json.dumps(_MISTRAL_MARK)
                return f"start: {head} %json {_schema(array)}"
            case _:
                return f"start: %json {_schema(one)}"


class ToolCallStream:
    """Splits a streamed reply into content and calls: content flows until something that may
    begin a call; calls come out as they complete (Hermes) or at the end."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self._held = ""  # text that is, or may become, a call
        self._seen = ""  # content sent so far (a Llama call must start the reply)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        """(content to send, calls completed) after ``text``; ``final``: the reply ended."""
        held = self._held + text
        calls: list[ToolCall] = []
        if self.fmt.family == HERMES:
            while (end := held.find(_HERMES_CLOSE)) >= 0 and _HERMES_OPEN in held[:end]:
                start = held.index(_HERMES_OPEN)
                block = held[start : end + len(_HERMES_CLOSE)]
                rest, found = self.fmt.parse(block)
                if not found:
                    break
                calls += found
                held = held[:start] + held[end + len(_HERMES_CLOSE) :]
        if final:
            rest, found = self.fmt.parse(held)
            self._held = ""
            return self._content(rest), calls + found
        cut = self._cut(held)
        self._held = held[cut:]
        return self._content(held[:cut]), calls

    def _content(self, text: str) -> str:
        self._seen += text
        return text

    def _cut(self, held: str) -> int:
        """Where the text that may be a call starts in ``held`` (len: none of it)."""
        match self.fmt.family:
            case ToolFamily.HERMES | ToolFamily.MISTRAL:
                mark = _HERMES_OPEN if self.fmt.family == HERMES else _MISTRAL_MARK
                at = held.find(mark)
                if at >= 0:
                    return at
                if (
                    self.fmt.family == MISTRAL
                    and not self._seen.strip()
                    and held.lstrip()[:1] in ("", "[")
                ):  # (its marker may be hidden)
                    return 0
                return len(held) - partial_marker(held, mark)
            case _:
                if self._seen.strip():
                    return len(held)
                body = held.lstrip()
                if (
                    not body
                    or body.startswith(("{", "["))
                    or _LLAMA_TAG.startswith(body[: len(_LLAMA_TAG)])
                ):
                    return 0
                return len(held)


def tool_format(chat_template: str | None) -> ToolFormat:
    """The tool-call family of a model, from its chat template."""
    template = chat_template or ""
    renders = "tools" in template
    if _HERMES_OPEN in template:
        return ToolFormat(HERMES, renders)
    if _MISTRAL_MARK in template:
        return ToolFormat(MISTRAL, renders)
    if _LLAMA_TAG in template or ("<|start_header_id|>" in template and renders):
        return ToolFormat(LLAMA3, renders)
    return ToolFormat(HERMES, False)


# -- helpers -------------------------------------------------------------------------------------


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = tool["function"]
    return function


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params: dict[str, Any] = _function(tool).get("parameters") or {"type": "object"}
    return params


def _schema(schema: dict[str, Any]) -> str:
    return json.dumps({**schema, "x-guidance": _COMPACT})


def _read_call(text: str, key: str = "arguments") -> ToolCall | None:
    """One call from its JSON text ({"name": ..., "arguments" or "parameters": {...}})."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    return _call_of(raw, key)


def _call_of(raw: Any, key: str) -> ToolCall | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None
    args = raw.get(key, raw.get("arguments", raw.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(raw["name"], json.dumps(args, ensure_ascii=False))


def _read_calls(text: str, key: str = "arguments") -> list[ToolCall] | None:
    """Calls from a JSON object, a JSON list of them, or objects separated by ';' (Llama)."""
    pieces = [text]
    try:
        raw = json.loads(text)
    except ValueError:
        pieces = [p for p in text.split(";") if p.strip()]
        try:
            raw = [json.loads(p) for p in pieces]
        except ValueError:
            return None
    items = raw if isinstance(raw, list) else [raw]
    calls = [_call_of(item, key) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _template_message(m: dict[str, Any]) -> dict[str, Any]:
    calls = m.get("tool_calls")
    if not calls:
        return m
    out = [{**c, "function": {**c["function"], "arguments": _arguments(c)}} for c in calls]
    return {**m, "tool_calls": out}


def _arguments(call: dict[str, Any]) -> Any:
    args = call["function"].get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def _plain_message(m: dict[str, Any]) -> dict[str, Any]:
    """A message of the tool conversation as a plain turn (Hermes blocks, as Qwen writes)."""
    if m["role"] == "tool":
        return {
            "role": "user",
            "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>",
        }
    calls = m.get("tool_calls")
    if not calls:
        return m
    blocks = [
        _HERMES_OPEN
        + "\n"
        + json.dumps(
            {"name": c["function"]["name"], "arguments": _arguments(c)}, ensure_ascii=False
        )
        + "\n"
        + _HERMES_CLOSE
        for c in calls
    ]
    text = "\n".join(([m["content"]] if m.get("content") else []) + blocks)
    return {"role": m["role"], "content": text}


def _tool_listing(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call functions to answer. They are listed as JSON inside <tools></tools>:"
        f"\n<tools>\n{lines}\n</tools>\nTo call one, answer with its name and arguments "
        "as a JSON object inside <tool_call></tool_call> tags:\n<tool_call>\n"
        '{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>'
    )
