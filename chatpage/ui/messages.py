"""Messages from the engine thread to the app (widgets' own messages are nested in the widgets)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message

from chatpage.engine.client import EngineClient, StreamEvent


@dataclass
class EngineEvent(Message):
    """A StreamEvent from ``client``'s engine thread, handed to the UI thread."""

    event: StreamEvent
    client: EngineClient


@dataclass
class EngineStatus(Message):
    """A progress line from ``client``'s engine thread (loading, kernels, ready, error)."""

    text: str
    client: EngineClient
