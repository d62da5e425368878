"""ChatApp: many chats over one local paged-KV engine, with a live view of its block pool.

The app holds what outlives a screen: the engine client, the open chats (`Chats`), the store
behind them, the personas, the theme, the keymap and the command palette. The chats themselves
are shown by `ChatScreen`. The engine runs on its own thread (an `EngineClient`); its updates gather
in an `Inbox` that this app empties in batches (`EngineEvents` says when) and `Chats` applies
them to the sessions. Nothing here waits on the engine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.notifications import SeverityLevel
from textual.screen import Screen

from chatpage.chat.chats import Chats
from chatpage.chat.mcp import McpServers
from chatpage.chat.recorder import SAVE_INTERVAL_S
from chatpage.config.models import remember_model
from chatpage.config.paths import data_dir
from chatpage.config.personas import Persona, default_persona, find_persona, load_personas
from chatpage.config.settings import Settings
from chatpage.engine.client import (
    EngineClient,
    EngineConfig,
    EngineStats,
    EngineStatus,
    LocalEngineClient,
    StatusKind,
    UpdateCallback,
)
from chatpage.remote.stats import RemoteStats
from chatpage.store import Store
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.bindings import APP_BINDINGS, all_bindings
from chatpage.ui.chat_screen import ChatScreen
from chatpage.ui.history import SavedChats
from chatpage.ui.messages import ClientStatus, EngineEvents, Inbox
from chatpage.ui.palette import palette_commands
from chatpage.ui.pulling import ModelPulls
from chatpage.ui.screens.model_picker import (
    ModelPicker,
    PullChoice,
    is_backend_url,
    model_problem,
    offered_models,
)
from chatpage.ui.terminal import read_keys_as_meant
from chatpage.ui.text import clean
from chatpage.ui.theme import CHATPAGE_THEME

STATS_INTERVAL_S = 1.0
"""How often the gauge reads the engine's stats (each repaint costs the app's thread, which shares
the GIL with the engine's)."""
STOP_WAIT_S = 10.0
"""How long a model switch waits for the replies in progress to stop."""
DRAIN_S = 0.05
"""How long a stream's updates gather before the app applies them (an output's last update is
applied at once): a few tokens per wake-up of the app's thread instead of one."""
FALLBACK_PERSONA = Persona(
    "assistant",
    "A helpful assistant",
    "You are a helpful, honest assistant.",
)


class ChatApp(App[None]):
    """The chat UI. ``ChatApp(model, config, settings).run()``.

    ``model`` None uses ``settings.model`` (None there too: the default model); ``config`` None
    builds one from ``settings.kv_cache`` and ``settings.block_size``. ``personas_dirs`` None
    loads the shipped personas and the user's (``config_dir()/personas``). ``store`` None opens
    the chat database in the data dir (``Store.open()``) at mount. ``warnings`` (e.g. from
    `load_settings`) are shown as notices at start. ``client`` is a ready-made engine client
    (e.g. a `RemoteEngineClient`); None starts a local engine (`LocalEngineClient`).
    """

    CSS_PATH = "app.tcss"
    TITLE = "chatpage"
    BINDINGS = APP_BINDINGS
    chat: ChatScreen  # pushed on mount
    saved: SavedChats  # set on mount

    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        settings: Settings | None = None,
        personas_dirs: list[Path] | None = None,
        store: Store | None = None,
        warnings: Sequence[str] = (),
        client: EngineClient[EngineStats | RemoteStats] | None = None,
    ) -> None:
        super().__init__()
        read_keys_as_meant()
        self.settings = settings or Settings()
        self.store = store
        self._warnings = list(warnings)
        if config is None:
            config = EngineConfig(
                kv_cache_bytes=self.settings.kv_cache, block_size=self.settings.block_size
            )
        self.engine_config = config  # what a local model switched to runs with
        self.client: EngineClient[EngineStats | RemoteStats] = client or LocalEngineClient(
            model if model is not None else self.settings.model, config
        )
        self._gathering: set[Inbox] = set()  # inboxes whose updates are taken on a timer
        self._loading: EngineClient[EngineStats | RemoteStats] | None = None
        """A model being switched to, loading beside the one in use (see `switch_model`)."""
        self._announced: EngineClient[EngineStats | RemoteStats] | None = None
        self.pulls = ModelPulls(self, lambda: self.chat.gauge, self.say, self.switch_model)
        """A model being pulled from Hugging Face (the picker starts and cancels it)."""
        """The client whose readiness was last shown (see `_model_ready`)."""
        self.tools = McpServers(
            self.settings.mcp_servers,
            lambda line: self.say(line, "error", timeout=15),
            data_dir() / "mcp-logs",
        )
        self.chats = Chats(
            self.client,
            self._delivery(self.client),
            notify=lambda line: self.say(line, "warning", timeout=10),
            tools=self.tools,
        )
        self.personas_dirs = personas_dirs
        self.personas: list[Persona] = []
        self.notices: list[str] = []
        """Every notice shown, as "severity: text" (for logs and tests)."""
        self.keymap: dict[str, str] = {}
        """The user's binding id -> key overrides in force."""
        self.register_theme(CHATPAGE_THEME)
        self._theme_problem: str | None = None
        wanted = self.settings.theme or "chatpage"
        if wanted in self.available_themes:
            self.theme = wanted
        else:
            self.theme = "chatpage"
            self._theme_problem = (
                f"theme {wanted!r} does not exist; using 'chatpage' "
                "(the command palette's Theme lists the others)"
            )

    async def on_mount(self) -> None:
        for warning in self._warnings:
            self.say(warning, "warning", timeout=12)
        self._apply_keymap()
        if self._theme_problem:
            self.say(self._theme_problem, "warning")
        if self.store is None:
            self.store = Store.open()
        self.saved = SavedChats(self.store, self.chats, self.say)
        self.chat = ChatScreen(
            self.chats,
            self.personas,
            self.default_persona,
            self.say,
            self.reload_personas,
            self.key_for,
        )
        await self.push_screen(self.chat)
        self.reload_personas()
        if not self.store.persistent:
            self.chat.gauge.saving = (
                f"not saving: {self.store.fault or 'chats are kept in memory only'}"
            )
        self._start(self.client)
        self.set_interval(STATS_INTERVAL_S, self._poll_stats)
        self.set_interval(SAVE_INTERVAL_S / 2, self.saved.recorder.flush)
        await self.chat.begin(self.saved)

    async def on_unmount(self) -> None:
        if hasattr(self, "saved"):
            if self.chat.current is not None:  # the chat on show keeps its unsent text too
                self.chat.current.draft = self.chat.prompt.text
            self.saved.stop()
        self.pulls.cancel()  # what it fetched stays, for the next pull to resume
        await self.tools.close()  # stdio servers' processes end with the app
        await asyncio.to_thread(self.client.close)  # joins the engine thread: not on the loop
        if self._loading is not None:
            await asyncio.to_thread(self._loading.close)

    # -- keys ----------------------------------------------------------------------------------------
    def _apply_keymap(self) -> None:
        keymap = dict(self.settings.bindings)
        known = {b.id for b in all_bindings()}
        unknown = sorted(set(keymap) - known)
        if unknown:
            self.say(
                f"config.yaml bindings: unknown id {', '.join(unknown)}; the ids are "
                f"listed in help (f1)",
                "warning",
            )
        self.keymap = {k: v for k, v in keymap.items() if k in known}
        self.set_keymap(self.keymap)

    def key_for(self, binding_id: str) -> str | None:
        """The key(s) bound to ``binding_id`` after the user's keymap."""
        for binding in all_bindings():
            if binding.id == binding_id:
                return self.keymap.get(binding_id, binding.key)
        return None

    async def action_act(self, action_id: str) -> None:
        """What a key of the app's own runs: the action, on the chat screen."""
        await self.chat.act(BY_ID[action_id])

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if screen is getattr(self, "chat", None):
            yield from palette_commands(self.chat, self.key_for)

    # -- personas --------------------------------------------------------------------------------
    def reload_personas(self) -> None:
        """Load the personas again (the list is shared with the chat screen); their system
        prompts are pinned in the engine."""
        self.personas[:] = self._load_personas()
        for persona in self.personas:
            self.chats.pin(persona.system_prompt)

    def _load_personas(self) -> list[Persona]:
        personas, errors = load_personas(self.personas_dirs)
        for error in errors:
            self.say(f"persona file skipped: {error}", "warning", timeout=12)
        if not personas:
            self.say("no personas could be loaded; using a plain assistant", "warning")
            personas = [FALLBACK_PERSONA]
        wanted = self.settings.default_persona
        if find_persona(personas, wanted) is None:
            self.say(
                f"default_persona {wanted!r} is not a persona; new chats use "
                f"{default_persona(personas, wanted).name!r}",
                "warning",
                timeout=12,
            )
        return personas

    def default_persona(self) -> Persona:
        return default_persona(self.personas, self.settings.default_persona)

    # -- notices ----------------------------------------------------------------------------------
    def say(
        self, message: str, severity: SeverityLevel = "information", timeout: float | None = None
    ) -> None:
        """Show a one-line notice (never parsed as markup) and log it in `notices`."""
        message = clean(message)
        self.notices.append(f"{severity}: {message}")
        self.notify(message, severity=severity, markup=False, timeout=timeout or None)

    # -- the engine ------------------------------------------------------------------------------
    def _delivery(self, client: EngineClient[object]) -> UpdateCallback:
        """How ``client``'s updates reach this app (called on its engine thread: no waiting): into
        an inbox that this app empties DRAIN_S after its first update, at once for a last one."""

        def wake(urgent: bool) -> None:
            self.post_message(EngineEvents(inbox, client, urgent))

        inbox = Inbox(wake)
        return inbox.put

    def _start(self, client: EngineClient[object]) -> None:
        """Start ``client``; its statuses come to this app, tagged with it."""

        def status(status: EngineStatus) -> None:
            self.post_message(ClientStatus(status, client))

        client.start(status)

    def make_client(self, target: str | None) -> EngineClient[EngineStats | RemoteStats]:
        """A new (not started) client for the model ``target`` (None: the default model; a URL:
        an OpenAI-compatible server, through the remote client)."""
        if target is not None and is_backend_url(target):
            from chatpage.remote.client import RemoteEngineClient  # needs the serve extra

            return RemoteEngineClient(target, timeout_s=self.settings.backend_timeout)
        return LocalEngineClient(target, self.engine_config)

    def on_engine_events(self, message: EngineEvents) -> None:
        inbox, client = message.inbox, message.client
        if message.urgent:
            self._take(inbox, client)
        elif inbox not in self._gathering:
            self._gathering.add(inbox)
            self.set_timer(DRAIN_S, lambda: self._take(inbox, client))

    def _take(self, inbox: Inbox, client: EngineClient[object]) -> None:
        self._gathering.discard(inbox)
        updates = inbox.take()
        if client is self.client:  # (a model switched away from says nothing more)
            self.chats.requests.apply_all(updates)

    def on_client_status(self, message: ClientStatus) -> None:
        gauge = self.chat.gauge
        status = message.status
        if message.client is self._loading:  # a model being switched to (see _swap_client)
            if status.kind not in (StatusKind.ERROR, StatusKind.READY):
                gauge.status = (
                    f"{self.client.model_name} · ready · loading "
                    f"{message.client.model or 'the default model'}: {status}…"
                )
            return
        if message.client is not self.client:
            return
        match status.kind:
            case StatusKind.READY:
                self._model_ready(self.client)
            case StatusKind.WARNING:
                self.say(status.text, "warning", timeout=15)
            case StatusKind.ERROR:
                gauge.status = str(status)
                self.say(str(status), "error", timeout=20)
            case StatusKind.PROGRESS:
                gauge.status = f"{status}…"

    def _model_ready(self, client: EngineClient[EngineStats | RemoteStats]) -> None:
        """``client`` (the one in use) is ready: said once, however its "ready" arrives."""
        if client is self._announced:
            return
        self._announced = client
        self.chat.gauge.status = (
            f"{client.model_name} · ready · context "
            f"{client.max_model_len} tokens · {len(self.personas)} personas"
        )
        for warning in client.warnings:
            self.say(warning, "warning")
        if client.model and not is_backend_url(client.model):
            remember_model(client.model)
        self.chats.model_ready()
        self._poll_stats()

    @work(exclusive=True, group="dialog")
    async def action_switch_model(self) -> None:
        """The model picker; the model picked replaces the one in use."""
        in_use = getattr(self.client, "url", None) or self.client.model
        found = await asyncio.to_thread(offered_models, self.settings.models_dirs)
        target = await self.push_screen_wait(
            ModelPicker(in_use, self.settings.model, self.settings.backend, found, self.pulls.ref)
        )
        if isinstance(target, PullChoice) and target.ref:
            self.pulls.start(target.ref)
        elif isinstance(target, PullChoice):
            self.pulls.cancel()
        elif target is not None:
            self.switch_model(target)

    def on_chat_screen_model_wanted(self, message: ChatScreen.ModelWanted) -> None:
        if message.target is None:
            self.action_switch_model()
        else:
            self.switch_model(message.target)

    def switch_model(self, target: str) -> None:
        """Replace the model with ``target`` ("" for the default): it loads beside the one in
        use, which keeps answering; once it is ready, replies in progress stop, the chats move
        to it (their system prompts pinned on it) and the old engine is closed (off the UI
        thread). If it fails to load, the model in use stays and a notice says why."""
        problem = model_problem(target) if target else None
        if problem:
            self.say(problem, "error")
        elif self._loading is not None:
            self.say(
                f"{self._loading.model or 'the default model'} is still loading; switch "
                "again once it is ready (or it failed)",
                "warning",
            )
        else:
            self._swap_client(target)

    @work(exclusive=True, group="model")
    async def _swap_client(self, target: str) -> None:
        name = target or "the default model"
        new = self.make_client(target or None)
        self._loading = new
        self._start(new)
        self.say(f"loading {name}; {self.client.model_name} answers until it is ready")
        try:
            await asyncio.to_thread(new.wait_ready)
        finally:
            self._loading = None
        if not new.ready:
            self.say(
                f"could not switch to {name}: {new.error}; {self.client.model_name} is "
                "still serving",
                "error",
                timeout=20,
            )
            self._poll_stats()
            await asyncio.to_thread(new.close)
            return
        for session in self.chats.sessions:
            self.chats.requests.stop(session)
        deadline = time.monotonic() + STOP_WAIT_S
        while any(s.streaming for s in self.chats.sessions) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        old = self.client
        self.client = self.chats.requests.client = new
        self.chats.requests.deliver = self._delivery(new)
        self.chat.gauge.stats = None
        for prompt in self.chats.pinned:
            new.pin_system_prompt(prompt)
        self._model_ready(new)
        self.say(f"switched to {name}; the chats stay")
        await asyncio.to_thread(old.close)

    def _poll_stats(self) -> None:
        stats = self.client.stats()
        if stats is not None:
            self.chat.gauge.stats = stats


def run_app(
    model: str | None = None,
    config: EngineConfig | None = None,
    settings: Settings | None = None,
    personas_dirs: list[Path] | None = None,
) -> None:
    """Run the chat UI until the user quits."""
    ChatApp(model, config, settings, personas_dirs).run()
