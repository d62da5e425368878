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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from chatpage.engine.accumulator import add_tool_calls
from chatpage.engine.outputs import ToolCall, ToolCallDelta, new_call_id
from chatpage.engine.text.json_scan import CallObject, Step
from chatpage.engine.text.reasoning import partial_marker

__all__ = ["ToolCall", "ToolCallDelta", "ToolCallParser", "ToolFamily", "ToolFormat", "tool_format"]


class ToolFamily(enum.StrEnum):
    """The tool-call formats chatpage reads and writes."""

    HERMES = "hermes"
    LLAMA3 = "llama3_json"
    MISTRAL = "mistral"


HERMES, LLAMA3, MISTRAL = ToolFamily.HERMES, ToolFamily.LLAMA3, ToolFamily.MISTRAL
_HERMES_OPEN, _HERMES_CLOSE = "<tool_call>", "</tool_call>"
_MISTRAL_MARK = "[TOOL_CALLS]"
_LLAMA_TAG = "<|python_tag|>"
_WHITESPACE = " \t\r\n"
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


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
        content, deltas = self.stream().feed(text, final=True)
        return content, add_tool_calls([], deltas)

    def stream(self) -> ToolCallParser:
        """A parser of one streamed reply."""
        return ToolCallParser(self)

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


class ToolCallParser:
    """Splits one reply's text, as it streams, into content and tool calls: content flows
    until something that may begin a call; a call comes out as `ToolCallDelta`s, its id and
    name once its name is whole, then its arguments' JSON text as it grows. Text that turns
    out to be no call is content after all (unless a call of it already came out); the
    whitespace around calls is dropped."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.count = 0  # calls begun
        self._held = ""  # content that may still begin a call
        self._space = ""  # content whitespace not sent yet (dropped before a call)
        self._seen = False  # content or calls came before (a Llama call must start the reply)
        self._state: str | None = None  # None: content; else where in the calls it is
        self._array = False  # the calls are a JSON list
        self._raw: str | None = None  # the calls' text while none of it came out
        self._object: CallObject | None = None
        self._header = False  # the call being read came out (its id and name)
        self._close = ""  # how much of Hermes' closing tag was read

    def copy(self) -> ToolCallParser:
        twin = ToolCallParser(self.fmt)
        twin.__dict__.update(self.__dict__)
        twin._object = self._object.copy() if self._object is not None else None
        return twin

    def feed(self, text: str, final: bool = False) -> tuple[str, tuple[ToolCallDelta, ...]]:
        """(content to send, the calls' deltas) after ``text``; ``final``: the reply ended."""
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        text, self._held = self._held + text, ""
        at = 0
        while at < len(text):
            if self._state is None:
                at = self._content(text, at, final, content)
            else:
                at = self._call_char(text, at, content, deltas)
        if final:
            if self._state is not None and self._raw is not None:
                self._send(self._raw, content)  # an unfinished call that never came out
            self._state = None
            if not self.count:
                content.append(self._space)
            self._space = ""
        return "".join(content), _merged(deltas)

    # -- content ----------------------------------------------------------------------------------
    def _send(self, piece: str, content: list[str]) -> None:
        """Content goes out; its trailing whitespace waits (a call may come next)."""
        kept = piece.rstrip()
        if kept:
            content.append(self._space + kept)
            self._space, self._seen = piece[len(kept) :], True
        else:
            self._space += piece

    def _open(self, raw: str) -> None:
        self._state, self._raw, self._array = "open", self._space + raw, False
        self._space = ""

    def _content(self, text: str, at: int, final: bool, content: list[str]) -> int:
        """Send content from ``at`` up to where a call may begin; where it stopped."""
        rest = text[at:]
        family = self.fmt.family
        if family != HERMES and not self._seen:  # a call without its (hidden) marker
            body = rest.lstrip()
            lead = len(rest) - len(body)
            mark = _MISTRAL_MARK if family == MISTRAL else _LLAMA_TAG
            if not body:
                self._send(rest, content)
                return len(text)
            if mark.startswith(body) and not final:
                self._held = rest
                return len(text)
            if body.startswith(mark) and family == LLAMA3:
                self._send(rest[:lead], content)
                self._open(body[: len(mark)])
                return at + lead + len(mark)
            if body[0] in ("{[" if family == LLAMA3 else "[") and not body.startswith(mark):
                self._send(rest[:lead], content)
                self._open("")
                return at + lead
        if family == LLAMA3:
            self._send(rest, content)
            return len(text)
        mark = _HERMES_OPEN if family == HERMES else _MISTRAL_MARK
        found = rest.find(mark)
        if found >= 0:
            self._send(rest[:found], content)
            self._open(mark)
            return at + found + len(mark)
        keep = 0 if final else partial_marker(rest, mark)
        self._send(rest[: len(rest) - keep], content)
        self._held = rest[len(rest) - keep :]
        return len(text)

    # -- calls ------------------------------------------------------------------------------------
    def _call_char(
        self, text: str, at: int, content: list[str], deltas: list[ToolCallDelta]
    ) -> int:
        """Read one character of the calls; where to go on (``at`` itself when the character
        belongs to the content after them)."""
        ch, state = text[at], self._state
        if state == "object":
            assert self._object is not None
            step = self._object.feed(ch)
            if step is Step.BAD or (step is Step.DONE and self._object.name is None):
                return self._fail(at, content)
            self._grow(ch)
            self._emit(deltas)
            if step is Step.DONE:
                if not self._object.has_arguments:
                    deltas.append(ToolCallDelta(self.count - 1, arguments="{}"))
                self._state, self._object = "after", None
            return at + 1
        if state == "close":
            self._close += ch
            if not _HERMES_CLOSE.startswith(self._close):
                self._send(self._close[:-1], content)
                return self._finish(at)
            if self._close == _HERMES_CLOSE:
                self._finish(at)
            return at + 1
        if ch in _WHITESPACE:
            self._grow(ch)
            return at + 1
        if state in ("open", "items") and ch == "{":
            self._state, self._object, self._header = "object", CallObject(), False
        elif state == "open" and ch == "[" and self.fmt.family != HERMES:
            self._state, self._array = "items", True
        elif state == "after" and self._array and ch in ",]":
            if ch == "]":
                return self._finish(at + 1)
            self._state = "items"
        elif state == "after" and self.fmt.family == HERMES and ch == "<":
            self._state, self._close = "close", "<"
        elif state == "after" and self.fmt.family == LLAMA3 and ch == ";":
            self._state = "open"
        elif state == "after":
            return self._finish(at)
        else:
            return self._fail(at, content)
        self._grow(ch)
        return at + 1

    def _grow(self, ch: str) -> None:
        if self._raw is not None:
            self._raw += ch

    def _emit(self, deltas: list[ToolCallDelta]) -> None:
        """The call being read comes out once its name is known, then its arguments' text."""
        obj = self._object
        assert obj is not None
        if obj.name is None:
            return
        if not self._header:
            deltas.append(ToolCallDelta(self.count, new_call_id(), obj.name, obj.take()))
            self.count += 1
            self._header, self._raw = True, None
        elif obj.pending:
            deltas.append(ToolCallDelta(self.count - 1, arguments=obj.take()))

    def _fail(self, at: int, content: list[str]) -> int:
        """Not a call after all: its text so far is content (when none of it came out)."""
        if self._raw is not None:
            self._send(self._raw, content)
        return self._finish(at)

    def _finish(self, at: int) -> int:
        self._state, self._object, self._raw, self._array = None, None, None, False
        self._seen = True
        return at


def _merged(deltas: list[ToolCallDelta]) -> tuple[ToolCallDelta, ...]:
    """One delta per call: its pieces of one step joined."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            last = out[-1]
            out[-1] = ToolCallDelta(last.index, last.id, last.name, last.arguments + d.arguments)
        else:
            out.append(d)
    return tuple(out)


def forced_tools(tools: list[dict[str, Any]], choice: str) -> list[dict[str, Any]]:
    """The tools a ``tool_choice`` makes the reply call: all for ``required``, the named one for
    a function's name, none for ``auto`` and ``none`` (the model chooses, or calls nothing)."""
    if choice in ("none", "auto"):
        return []
    if choice == "required":
        return tools
    return [t for t in tools if t["function"]["name"] == choice]


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
