"""ModelSwitch: the app's model, said ready once, and switched to another without a pause.

The model switched to loads beside the one in use, which keeps answering; once it is ready,
replies in progress stop, the chats move to it (their system prompts pinned on it) and the old
engine is closed off the UI thread. One that fails to load is closed and the model in use stays
(the fallback): a notice says why. Meanwhile the statuses of the client loading show in the
status line after the model in use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from textual.notifications import SeverityLevel

from chatpage.chat.chats import Chats
from chatpage.config.models import remember_model
from chatpage.config.personas import Persona
from chatpage.config.settings import Settings
from chatpage.engine.client import (
    EngineClient,
    EngineConfig,
    EngineStats,
    LocalEngineClient,
    StatusKind,
    UpdateCallback,
)
from chatpage.remote.stats import RemoteStats
from chatpage.ui.chat_screen import ChatScreen
from chatpage.ui.messages import ClientStatus
from chatpage.ui.screens.model_picker import is_backend_url, model_problem

STOP_WAIT_S = 10.0
"""How long a model switch waits for the replies in progress to stop."""

Client = EngineClient[EngineStats | RemoteStats]


class ModelHost(Protocol):
    """What the switch acts on (the app): the client in use, the chats it serves, the screen
    whose gauge shows the model, the personas (counted when it is ready)."""

    client: Client
    chats: Chats
    chat: ChatScreen
    personas: list[Persona]
    settings: Settings
    engine_config: EngineConfig

    def say(
        self, message: str, severity: SeverityLevel = "information", timeout: float | None = None
    ) -> None: ...

    def run_worker(self, work: Any, *, group: str = ..., exclusive: bool = ...) -> Any: ...


class ModelSwitch:
    """The app's model: ``start`` starts a client (its statuses come back to `status`),
    ``delivery`` gives the callback its updates go to."""

    def __init__(
        self,
        app: ModelHost,
        start: Callable[[EngineClient[object]], None],
        delivery: Callable[[EngineClient[object]], UpdateCallback],
    ) -> None:
        self.app = app
        self.start = start
        self.delivery = delivery
        self.loading: Client | None = None
        """A model being switched to, loading beside the one in use (see `switch`)."""
        self._announced: Client | None = None
        """The client whose readiness was last shown (see `ready`)."""

    def make_client(self, target: str | None) -> Client:
        """A new (not started) client for the model ``target`` (None: the default model; a URL:
        an OpenAI-compatible server, through the remote client)."""
        if target is not None and is_backend_url(target):
            from chatpage.remote.client import RemoteEngineClient  # needs the serve extra

            return RemoteEngineClient(target, timeout_s=self.app.settings.backend_timeout)
        return LocalEngineClient(target, self.app.engine_config)

    def status(self, message: ClientStatus) -> None:
        """A status from a client: the one loading beside, or the one in use."""
        gauge = self.app.chat.gauge
        status = message.status
        if message.client is self.loading:  # a model being switched to (see _swap)
            if status.kind not in (StatusKind.ERROR, StatusKind.READY):
                gauge.status = (
                    f"{self.app.client.model_name} · ready · loading "
                    f"{message.client.model or 'the default model'}: {status}…"
                )
            return
        if message.client is not self.app.client:
            return
        match status.kind:
            case StatusKind.READY:
                self.ready(self.app.client)
            case StatusKind.WARNING:
                self.app.say(status.text, "warning", timeout=15)
            case StatusKind.ERROR:
                gauge.status = str(status)
                self.app.say(str(status), "error", timeout=20)
            case StatusKind.PROGRESS:
                gauge.status = f"{status}…"

    def ready(self, client: Client) -> None:
        """``client`` (the one in use) is ready: said once, however its "ready" arrives."""
        if client is self._announced:
            return
        self._announced = client
        self.app.chat.gauge.status = (
            f"{client.model_name} · ready · context "
            f"{client.max_model_len} tokens · {len(self.app.personas)} personas"
        )
        for warning in client.warnings:
            self.app.say(warning, "warning")
        if client.model and not is_backend_url(client.model):
            remember_model(client.model)
        self.app.chats.model_ready()
        self.poll_stats()

    def switch(self, target: str) -> None:
        """Replace the model with ``target`` ("" for the default): it loads beside the one in
        use, which keeps answering; once it is ready, replies in progress stop, the chats move
        to it (their system prompts pinned on it) and the old engine is closed (off the UI
        thread). If it fails to load, the model in use stays and a notice says why."""
        problem = model_problem(target) if target else None
        if problem:
            self.app.say(problem, "error")
        elif self.loading is not None:
            self.app.say(
                f"{self.loading.model or 'the default model'} is still loading; switch "
                "again once it is ready (or it failed)",
                "warning",
            )
        else:
            self.app.run_worker(self._swap(target), exclusive=True, group="model")

    async def _swap(self, target: str) -> None:
        app = self.app
        name = target or "the default model"
        new = self.make_client(target or None)
        self.loading = new
        self.start(new)
        app.say(f"loading {name}; {app.client.model_name} answers until it is ready")
        try:
            await asyncio.to_thread(new.wait_ready)
        finally:
            self.loading = None
        if not new.ready:
            app.say(
                f"could not switch to {name}: {new.error}; {app.client.model_name} is "
                "still serving",
                "error",
                timeout=20,
            )
            self.poll_stats()
            await asyncio.to_thread(new.close)
            return
        for session in app.chats.sessions:
            app.chats.requests.stop(session)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(s.streaming for s in app.chats.sessions) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        old = app.client
        app.client = app.chats.requests.client = new
        app.chats.requests.deliver = self.delivery(new)
        app.chat.gauge.stats = None
        for prompt in app.chats.pinned:
            new.pin_system_prompt(prompt)
        self.ready(new)
        app.say(f"switched to {name}; the chats stay")
        await asyncio.to_thread(old.close)

    def poll_stats(self) -> None:
        """Show the engine's stats in the gauge (on a timer, and when the model changes)."""
        stats = self.app.client.stats()
        if stats is not None:
            self.app.chat.gauge.stats = stats
