"""A tool call's JSON object read one character at a time, as a model writes it: the function's
name as soon as its string closes, the arguments' JSON text as it grows (a call's arguments can
stream token by token before the object is whole). Knows nothing of the call formats around the
object (`chatpage.engine.text.tool_calls`)."""

from __future__ import annotations

import enum
import json
from typing import Any

NAME_KEY = "name"
ARGUMENT_KEYS = ("arguments", "parameters")
"""Where a call object holds its arguments (Hermes and Mistral: arguments; Llama: parameters)."""
_PRIMITIVE = frozenset("0123456789+-.eEtruefalsn")
_WHITESPACE = " \t\r\n"


class Step(enum.Enum):
    """What a character did to the value or object being read."""

    MORE = "more"  # taken; the value goes on
    DONE = "done"  # taken; the value is complete
    ENDED = "ended"  # not taken: the value (a number or a literal) ended before it
    BAD = "bad"  # not JSON


class Value:
    """One JSON value, read a character at a time (its text kept)."""

    __slots__ = ("text", "_kind", "_depth", "_in_string", "_escaped")

    def __init__(self, first: str) -> None:
        self.text = first
        self._kind = "string" if first == '"' else "container" if first in "{[" else "primitive"
        self._depth = 1 if self._kind == "container" else 0
        self._in_string = first == '"'
        self._escaped = False

    @staticmethod
    def begins(ch: str) -> bool:
        return ch in '"{[' or ch in _PRIMITIVE

    @property
    def is_string(self) -> bool:
        return self._kind == "string"

    def copy(self) -> Value:
        twin = Value(self.text[0])
        twin.text, twin._depth = self.text, self._depth
        twin._in_string, twin._escaped = self._in_string, self._escaped
        return twin

    def feed(self, ch: str) -> Step:
        if self._kind == "primitive":
            if ch in _PRIMITIVE:
                self.text += ch
                return Step.MORE
            return Step.ENDED
        self.text += ch
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif ch == "\\":
                self._escaped = True
            elif ch == '"':
                self._in_string = False
                if self._kind == "string":
                    return Step.DONE
            return Step.MORE
        if ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if not self._depth:
                return Step.DONE
        return Step.MORE

    def decoded(self) -> Any:
        """The value's Python form (None when its text is not JSON)."""
        try:
            return json.loads(self.text)
        except ValueError:
            return None


class CallObject:
    """A call object after its ``{``: ``name`` once its string is whole; the arguments' new
    text in ``pending`` (take it with `take`); `feed` says when the object closed."""

    __slots__ = ("name", "pending", "has_arguments", "_state", "_value", "_target")

    def __init__(self) -> None:
        self.name: str | None = None
        self.pending = ""  # arguments text read and not taken yet
        self.has_arguments = False
        self._state = "key?"  # key? key, key colon value? value next
        self._value: Value | None = None  # the key being read, then its value
        self._target = ""  # what the value is: "name", "arguments" or "" (another key)

    def copy(self) -> CallObject:
        twin = CallObject()
        twin.name, twin.pending, twin.has_arguments = self.name, self.pending, self.has_arguments
        twin._state, twin._target = self._state, self._target
        twin._value = self._value.copy() if self._value is not None else None
        return twin

    def take(self) -> str:
        piece, self.pending = self.pending, ""
        return piece

    def feed(self, ch: str) -> Step:
        """MORE while the object goes on, DONE at its closing brace, BAD when it is not a call
        object. (A character is always taken.)"""
        state = self._state
        if state in ("key?", "key,", "colon", "value?", "next") and ch in _WHITESPACE:
            return Step.MORE
        if state in ("key?", "key,"):
            if ch == '"':
                self._state, self._value = "key", Value(ch)
                return Step.MORE
            return Step.DONE if ch == "}" and state == "key?" else Step.BAD
        if state == "key":
            assert self._value is not None
            if self._value.feed(ch) is Step.DONE:
                key = self._value.decoded()
                self._target = (
                    "name"
                    if key == NAME_KEY and self.name is None
                    else "arguments"
                    if key in ARGUMENT_KEYS and not self.has_arguments
                    else ""
                )
                self._state = "colon"
            return Step.MORE
        if state == "colon":
            self._state = "value?"
            return Step.MORE if ch == ":" else Step.BAD
        if state == "value?":
            if not Value.begins(ch):
                return Step.BAD
            self._state, self._value = "value", Value(ch)
            self._grow(ch)
            return Step.MORE
        if state == "value":
            assert self._value is not None
            step = self._value.feed(ch)
            if step is Step.ENDED:
                return self._value_end() or self.feed(ch)
            self._grow(ch)
            if step is Step.DONE:
                return self._value_end() or Step.MORE
            return Step.MORE
        if ch == ",":  # next
            self._state = "key,"
            return Step.MORE
        return Step.DONE if ch == "}" else Step.BAD

    def _grow(self, ch: str) -> None:
        """The arguments' text grows (a string holding the arguments is decoded once whole)."""
        assert self._value is not None
        if self._target == "arguments" and not self._value.is_string:
            self.pending += ch

    def _value_end(self) -> Step | None:
        """A value ended: keep the name or the arguments; BAD for a name that is no string."""
        assert self._value is not None
        value, self._state = self._value, "next"
        if self._target == "name":
            name = value.decoded()
            if not isinstance(name, str):
                return Step.BAD
            self.name = name
        elif self._target == "arguments":
            self.has_arguments = True
            if value.is_string:
                text = value.decoded()
                self.pending += text if isinstance(text, str) else value.text
        return None
