"""Messages from the engine thread to the app (widgets' own messages are nested in the widgets),
and the inbox that hands the engine's updates to the app's thread in batches."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from textual.message import Message

from chatpage.engine.client import EngineClient, EngineStatus, RequestUpdate


class Inbox:
    """RequestUpdates from one client's engine thread, taken by the app's thread in batches.

    A message per token would wake the app's thread ~100 times a second for one chat, and every
    wake-up holds the GIL the engine needs. Here the engine thread only appends; the first update
    after a take calls ``wake(False)`` (the app takes them a little later, with whatever came
    meanwhile), and an update that ends an output calls ``wake(True)`` (take now). No lock: appends
    and pops of a deque are atomic, and an update put during a take is either in it or wakes again.
    """

    def __init__(self, wake: Callable[[bool], None]) -> None:
        self._updates: deque[RequestUpdate] = deque()
        self._wake = wake
        self._woken = False

    def put(self, update: RequestUpdate) -> None:
        """Called on the engine thread: never waits."""
        self._updates.append(update)
        urgent = update.finished or any(d.finish_reason is not None for d in update.outputs)
        if urgent or not self._woken:
            self._woken = True
            self._wake(urgent)

    def take(self) -> list[RequestUpdate]:
        """Every update put so far, oldest first (the app's thread)."""
        self._woken = False
        updates = []
        while self._updates:
            updates.append(self._updates.popleft())
        return updates


@dataclass
class EngineEvents(Message):
    """``client``'s inbox has updates; ``urgent``: one of them ends an output."""

    inbox: Inbox
    client: EngineClient[object]
    urgent: bool


@dataclass
class ClientStatus(Message):
    """A status from ``client``'s engine thread (loading, kernels, ready, a warning, an error)."""

    status: EngineStatus
    client: EngineClient[object]
