"""Messages the UI posts between widgets and from the engine thread (all in one place)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatpage.engine.client import StreamEvent


@dataclass
class EngineEvent(Message):
    """A StreamEvent from the engine thread, handed to the UI thread."""

    event: StreamEvent


@dataclass
class EngineStatus(Message):
    """A progress line from the engine thread (loading, building kernels, ready, error)."""

    text: str


@dataclass
class SessionSelected(Message):
    """The user picked a session in the sidebar."""

    session_id: int


@dataclass
class PromptSubmitted(Message):
    """Enter in the prompt input: a message or a slash command."""

    text: str


@dataclass
class KeepAlternative(Message):
    """The user chose alternative ``number`` (1-based) of a session's panes."""

    session_id: int
    number: int


@dataclass
class CopyText(Message):
    """Put ``text`` on the clipboard; ``what`` names it in the notice ("reply", "code block")."""

    text: str
    what: str


@dataclass
class MarkdownFlushed(Message):
    """A streaming Markdown widget drew new text (its container may need to follow it)."""
