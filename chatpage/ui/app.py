"""ChatApp: many chats over one local paged-KV engine, with a live view of its block pool.

The app holds what outlives a screen: the engine client, the open chats (`Chats`), the store
behind them, the personas, the theme, the keymap and the command palette. The chats themselves
are shown by `ChatScreen`. The engine runs on its own thread (an `EngineClient`); its updates gather
in an `Inbox` that this app empties in batches (`EngineEvents` says when) and `Chats` applies
them to the sessions. Nothing here waits on the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.notifications import SeverityLevel
from textual.screen import Screen

from chatpage.chat.chats import Chats
from chatpage.chat.mcp import McpServers
from chatpage.chat.recorder import SAVE_INTERVAL_S
from chatpage.config.paths import data_dir
from chatpage.config.personas import Persona, default_persona, find_persona, load_personas
from chatpage.config.settings import Settings
from chatpage.engine.client import (
    EngineClient,
    EngineConfig,
    EngineStats,
    EngineStatus,
    LocalEngineClient,
    UpdateCallback,
)
from chatpage.remote.stats import RemoteStats
from chatpage.store import Store
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.bindings import APP_BINDINGS, all_bindings
from chatpage.ui.chat_screen import ChatScreen
from chatpage.ui.history import SavedChats
from chatpage.ui.messages import ClientStatus, EngineEvents, Inbox
from chatpage.ui.model_switch import ModelSwitch
from chatpage.ui.palette import palette_commands
from chatpage.ui.pulling import ModelPulls
from chatpage.ui.screens.model_picker import ModelPicker, PullChoice, offered_models
from chatpage.ui.terminal import read_keys_as_meant
from chatpage.ui.text import clean
from chatpage.ui.theme import CHATPAGE_THEME

STATS_INTERVAL_S = 1.0
"""How often the gauge reads the engine's stats (each repaint costs the app's thread, which shares
the GIL with the engine's)."""
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
        self.models = ModelSwitch(self, self._start, self._delivery)
        self.pulls = ModelPulls(self, lambda: self.chat.gauge, self.say, self.models.switch)
        """A model being pulled from Hugging Face (the picker starts and cancels it)."""
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
        self.set_interval(STATS_INTERVAL_S, self.models.poll_stats)
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
        if self.models.loading is not None:
            await asyncio.to_thread(self.models.loading.close)

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
        self.models.status(message)

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
            self.models.switch(target)

    def on_chat_screen_model_wanted(self, message: ChatScreen.ModelWanted) -> None:
        if message.target is None:
            self.action_switch_model()
        else:
            self.models.switch(message.target)


def run_app(
    model: str | None = None,
    config: EngineConfig | None = None,
    settings: Settings | None = None,
    personas_dirs: list[Path] | None = None,
) -> None:
    """Run the chat UI until the user quits."""
    ChatApp(model, config, settings, personas_dirs).run()
