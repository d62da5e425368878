"""Messages from the engine thread to the app (widgets' own messages are nested in the widgets)."""

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
