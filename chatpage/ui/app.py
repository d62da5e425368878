"""ChatApp: many chats over one local paged-KV engine, with a live view of its block pool.

The engine runs on its own thread (`EngineClient`); its events are posted to this app's message
queue (`EngineEvent`) and applied to the sessions by `Chats`. Nothing here waits on the engine.
Chats are saved as they change and the open ones come back at start (`chatpage.ui.history`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.text import Text
from textual import on
from textual.app import App, ComposeResult, SystemCommand
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import ContentSwitcher, Footer, Static

from chatpage.chat.chats import Chats
from chatpage.chat.commands import Command, message_text, parse_command
from chatpage.chat.recorder import Recorder
from chatpage.chat.session import AltMode, Change, ChatSession, SamplingSettings
from chatpage.config.personas import Persona, default_persona, find_persona, load_personas
from chatpage.config.settings import Settings
from chatpage.engine.client import EngineClient, StreamEvent
from chatpage.engine.config import EngineConfig
from chatpage.store import Store
from chatpage.ui import history
from chatpage.ui.bindings import APP_BINDINGS
from chatpage.ui.messages import (
    CopyText,
    EngineEvent,
    EngineStatus,
    KeepAlternative,
    PromptSubmitted,
    SessionSelected,
)
from chatpage.ui.palette import palette_commands
from chatpage.ui.screens.help import HelpScreen
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.sampling_settings import SamplingSettingsScreen
from chatpage.ui.slash_commands import run_slash_command
from chatpage.ui.text import clean, code_blocks
from chatpage.ui.theme import CHATPAGE_THEME
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList
from chatpage.ui.widgets.session_view import SessionView

STATS_INTERVAL_S = 0.3
FALLBACK_PERSONA = Persona(
    "assistant", "A helpful assistant", "You are a helpful, honest assistant.",
)
_ALT_CYCLE = {"off": "samples", "samples": "beam", "beam": "off"}
_MODAL_BLOCKED = {"close_session", "cycle_alternatives", "next_session", "prev_session", "stop",
                  "search_history"}


class ChatApp(App[None]):
    """The chat UI. ``ChatApp(model, config, settings).run()``.

    ``model`` None uses ``settings.model`` (None there too: the default model); ``config`` None
    builds one from ``settings.kv_cache`` and ``settings.block_size``. ``personas_dirs`` None
    loads the shipped personas and the user's (``config_dir()/personas``). ``store`` None opens
    the chat database in the data dir (``Store.open()``) at mount. ``warnings`` (e.g. from
    `load_settings`) are shown as notices at start. ``client`` is a ready-made engine client
    (e.g. a `RemoteEngineClient`); None starts a local engine.
    """

    CSS_PATH = "app.tcss"
    TITLE = "chatpage"
    BINDINGS = APP_BINDINGS
    gauge: BlockGauge  # set on mount

    def __init__(self, model: str | None = None, config: EngineConfig | None = None,
                 settings: Settings | None = None,
                 personas_dirs: list[Path] | None = None, store: Store | None = None,
                 warnings: Sequence[str] = (), client: EngineClient | None = None) -> None:
        super().__init__()
        self.settings = settings or Settings()
        self.store = store
        self.recorder: Recorder | None = None  # set on mount
        self._warnings = list(warnings)
        if config is None:
            config = EngineConfig(kv_cache_bytes=self.settings.kv_cache,
                                  block_size=self.settings.block_size)
        self.client = client or EngineClient(
            model if model is not None else self.settings.model, config)
        self.chats = Chats(self.client, self._deliver)
        self.personas_dirs = personas_dirs
        self.personas: list[Persona] = []
        self.current: ChatSession | None = None
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
            self._theme_problem = (f"theme {wanted!r} does not exist; using 'chatpage' "
                                   "(the command palette's Theme lists the others)")

    # -- layout -----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield SessionList(id="sidebar")
            with Vertical(id="chat"):
                yield ContentSwitcher(id="sessions")
                yield Static(id="prompt-info")
                yield PromptInput(id="prompt", placeholder="Message (enter sends, ctrl+j new "
                                                           "line, /help for commands)")
        yield BlockGauge(id="gauge")
        yield Footer()

    async def on_mount(self) -> None:
        self.gauge = self.query_one(BlockGauge)
        for warning in self._warnings:
            self.say(warning, "warning", timeout=12)
        self._apply_keymap()
        if self._theme_problem:
            self.say(self._theme_problem, "warning")
        self.personas = self._load_personas()
        self.client.start(lambda text: self.post_message(EngineStatus(text)))
        for prompt in dict.fromkeys(p.system_prompt for p in self.personas):
            self.client.pin_system_prompt(prompt)
        self.set_interval(STATS_INTERVAL_S, self._poll_stats)
        restored = history.start(self)
        for session in restored:
            self.add_session(session)
        if restored:
            self.switch_to(restored[0])
        else:
            await self.open_session(self.default_persona())
        self.query_one(PromptInput).focus()

    async def on_unmount(self) -> None:
        history.stop(self)
        await asyncio.to_thread(self.client.close)  # joins the engine thread: not on the loop

    def _apply_keymap(self) -> None:
        keymap = dict(self.settings.bindings)
        known = self.binding_ids()
        unknown = sorted(set(keymap) - known)
        if unknown:
            self.say(f"config.yaml bindings: unknown id {', '.join(unknown)}; the ids are "
                     f"listed in help (f1)", "warning")
        self.keymap = {k: v for k, v in keymap.items() if k in known}
        self.set_keymap(self.keymap)

    @classmethod
    def binding_ids(cls) -> set[str]:
        return {b.id for b in [*cls.BINDINGS, *AlternativesView.BINDINGS] if b.id}

    def _load_personas(self) -> list[Persona]:
        personas, errors = load_personas(self.personas_dirs)
        for error in errors:
            self.say(f"persona file skipped: {error}", "warning", timeout=12)
        if not personas:
            self.say("no personas could be loaded; using a plain assistant", "warning")
            personas = [FALLBACK_PERSONA]
        wanted = self.settings.default_persona
        if find_persona(personas, wanted) is None:
            self.say(f"default_persona {wanted!r} is not a persona; new chats use "
                     f"{default_persona(personas, wanted).name!r}", "warning", timeout=12)
        return personas

    def default_persona(self) -> Persona:
        return default_persona(self.personas, self.settings.default_persona)

    # -- notices ----------------------------------------------------------------------------------
    def say(self, message: str, severity: str = "information", timeout: float | None = None
            ) -> None:
        """Show a one-line notice (never parsed as markup) and log it in `notices`."""
        message = clean(message)
        self.notices.append(f"{severity}: {message}")
        self.notify(message, severity=severity, markup=False,  # type: ignore[arg-type]
                    **({"timeout": timeout} if timeout else {}))

    # -- the engine ------------------------------------------------------------------------------
    def _deliver(self, event: StreamEvent) -> None:
        """Called on the engine thread: hand the event over without blocking."""
        self.post_message(EngineEvent(event))

    def on_engine_event(self, message: EngineEvent) -> None:
        self.chats.apply(message.event)

    def on_engine_status(self, message: EngineStatus) -> None:
        gauge = self.gauge
        text = message.text
        if text == "ready":
            client = self.client
            gauge.status = (f"{client.model_name} · ready · context {client.max_model_len} "
                            f"tokens · {len(self.personas)} personas")
            for warning in client.warnings:
                self.say(warning, "warning")
            self._poll_stats()
        elif text.startswith(("error", "engine error")):
            gauge.status = text
            self.say(text, "error", timeout=20)
        else:
            gauge.status = f"{text}…"

    def _poll_stats(self) -> None:
        stats = self.client.stats()
        if stats is not None:
            self.gauge.stats = stats

    # -- sessions ---------------------------------------------------------------------------------
    def session_view(self, session: ChatSession) -> SessionView:
        """The session's view, mounted now if it never was (restored chats get theirs when
        first shown)."""
        found = self.query(f"#session-{session.id}")
        if found:
            return found.first(SessionView)
        view = SessionView(session)
        self._mount_hidden(view)
        return view

    def _mount_hidden(self, view: SessionView):
        view.display = False  # the switcher shows it when it becomes current
        return self.query_one(ContentSwitcher).mount(view)

    async def open_session(self, persona: Persona) -> ChatSession:
        session = self.chats.open(persona)
        session.observers.append(self._session_changed)
        await self._mount_hidden(SessionView(session))
        self.switch_to(session)
        return session

    def add_session(self, session: ChatSession) -> None:
        """Add a session built elsewhere (a saved chat) to the sidebar; its view is mounted
        when it is first shown."""
        self.chats.adopt(session)
        session.observers.append(self._session_changed)
        self._sync_sidebar()

    def switch_to(self, session: ChatSession) -> None:
        prompt = self.query_one(PromptInput)
        if self.current is not None and self.current is not session:
            self.current.draft = prompt.text
        self.current = session
        self.query_one(ContentSwitcher).current = self.session_view(session).id
        prompt.load_text(session.draft)
        prompt.move_cursor(prompt.document.end)
        prompt.use_prompts(session.history)
        self._sync_sidebar()
        self._show_prompt_info()
        self.refresh_bindings()
        panes = self.session_view(session).transcript.alternatives
        if isinstance(self.screen, ModalScreen):
            return
        (panes if panes is not None else prompt).focus()

    def _session_changed(self, session: ChatSession, change: Change) -> None:
        if change.kind in ("title", "busy", "generation"):
            self._sync_sidebar()
        if session is self.current and change.kind in ("attachments", "settings"):
            self._show_prompt_info()
        if change.kind == "busy":
            self.refresh_bindings()
        if change.kind == "generation" and session is self.current and not session.choosing:
            self.query_one(PromptInput).focus()

    def _sync_sidebar(self) -> None:
        self.query_one(SessionList).sync(self.chats.sessions, self.current)

    def _show_prompt_info(self) -> None:
        session = self.current
        text = Text()
        if session is not None:
            if session.alt_mode.kind != "off":
                text.append(f"next reply: {session.alt_mode.describe()}  ", "bold")
            for attachment in session.attachments:
                text.append(f"📎 {clean(attachment.name)} ({len(attachment.text):,} chars)  ")
        info = self.query_one("#prompt-info", Static)
        info.update(text)
        info.display = bool(text.plain)

    @on(SessionSelected)
    def _selected(self, message: SessionSelected) -> None:
        session = self.chats.get(message.session_id)
        if session is not None and session is not self.current:
            self.switch_to(session)

    def _step(self, step: int) -> None:
        sessions = self.chats.sessions
        if self.current is not None and len(sessions) > 1:
            index = sessions.index(self.current)
            self.switch_to(sessions[(index + step) % len(sessions)])

    # -- prompt and commands --------------------------------------------------------------------
    @on(PromptSubmitted)
    async def _submitted(self, message: PromptSubmitted) -> None:
        await self.submit_prompt(message.text)

    async def submit_prompt(self, text: str) -> None:
        """What enter in the prompt does: run a slash command or send a message."""
        session = self.current
        if session is None or (not text.strip() and not session.attachments):
            return
        prompt = self.query_one(PromptInput)
        try:
            command = parse_command(text)
            if command is None:
                self.chats.send(session, message_text(text))
            prompt.take()
            self._remember(session, text)
            if command is not None:
                await self.run_command(command)
        except ValueError as err:  # ChatError included: one line for the user
            self.say(str(err), "error")
            if not prompt.text:  # a command that failed comes back to be fixed
                prompt.load_text(text)
                prompt.move_cursor(prompt.document.end)

    @staticmethod
    def _remember(session: ChatSession, text: str) -> None:
        if not session.history or session.history[-1] != text:
            session.history.append(text)

    async def run_command(self, command: Command) -> None:
        """Run a slash command on the current session (ValueError: a one-line problem)."""
        await run_slash_command(self, command)

    # -- actions ----------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in _MODAL_BLOCKED and isinstance(self.screen, ModalScreen):
            return False
        if action == "stop":
            return True if self.current is not None and self.current.streaming else None
        return True

    def action_new_session(self) -> None:
        def picked(persona: Persona | None) -> None:
            if persona is not None:
                self.call_next(self.open_session, persona)

        self.push_screen(PersonaPicker(self.personas, self.default_persona()), picked)

    async def action_close_session(self) -> None:
        """Close the current chat; it stays saved (see `chatpage.ui.history`)."""
        if self.current is not None:
            await self.close_session(self.current)

    async def close_session(self, session: ChatSession) -> None:
        index = self.chats.sessions.index(session)
        self.chats.close(session)
        await self.query(f"#session-{session.id}").remove()
        if self.current is session:
            self.current = None
        if not self.chats.sessions:
            await self.open_session(self.default_persona())
        elif self.current is None:
            self.switch_to(self.chats.sessions[min(index, len(self.chats.sessions) - 1)])
        else:
            self._sync_sidebar()

    def action_delete_session(self) -> None:
        history.delete(self)

    def action_search_history(self) -> None:
        history.search(self)

    def action_export(self, fmt: str) -> None:
        history.export(self, fmt)

    def open_saved(self, store_id: int) -> None:
        """Switch to a saved chat, opening it again if it was closed."""
        history.open_saved(self, store_id)

    def action_next_session(self) -> None:
        self._step(+1)

    def action_prev_session(self) -> None:
        self._step(-1)

    def action_goto_session(self, number: int) -> None:
        if 1 <= number <= len(self.chats.sessions):
            self.switch_to(self.chats.sessions[number - 1])

    def action_stop(self) -> None:
        if self.current is not None:
            self.chats.stop(self.current)

    def action_regenerate(self) -> None:
        self._guard(lambda s: self.chats.regenerate(s))

    def action_edit_last(self) -> None:
        def edit(session: ChatSession) -> None:
            text = self.chats.edit_last(session)
            prompt = self.query_one(PromptInput)
            prompt.load_text(text)
            prompt.move_cursor(prompt.document.end)
            prompt.focus()

        self._guard(edit)

    def action_cycle_alternatives(self) -> None:
        session = self.current
        if session is not None:
            mode = session.alt_mode
            self.chats.set_alt_mode(session, AltMode(_ALT_CYCLE[mode.kind], mode.k))

    def action_sampling_settings(self) -> None:
        session = self.current
        if session is None:
            return

        def done(settings: SamplingSettings | None) -> None:
            if settings is not None and session in self.chats.sessions:
                self.chats.set_sampling(session, settings)

        self.push_screen(SamplingSettingsScreen(session.sampling, session.persona), done)

    def key_for(self, binding_id: str) -> str | None:
        """The key(s) bound to ``binding_id`` after the user's keymap."""
        for binding in [*self.BINDINGS, *AlternativesView.BINDINGS]:
            if binding.id == binding_id:
                return self.keymap.get(binding_id, binding.key)
        return None

    def action_help(self) -> None:
        rows = [(self.key_for(b.id) or "", b.id, b.description)
                for b in [*self.BINDINGS, *AlternativesView.BINDINGS] if b.id]
        self.push_screen(HelpScreen(rows))

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(SessionList)
        sidebar.display = not sidebar.display

    def action_copy_reply(self) -> None:
        reply = self.current.last("assistant") if self.current is not None else None
        if reply is None or not reply.content:
            self.say("there is no reply to copy yet", "warning")
            return
        self.post_message(CopyText(reply.content, "reply"))

    def action_copy_code(self) -> None:
        reply = self.current.last("assistant") if self.current is not None else None
        blocks = code_blocks(reply.content) if reply is not None else []
        if not blocks:
            self.say("the last reply has no code block", "warning")
            return
        self.post_message(CopyText(blocks[-1], "code block"))

    def _guard(self, run) -> None:
        if self.current is None:
            return
        try:
            run(self.current)
        except ValueError as err:
            self.say(str(err), "error")

    @on(KeepAlternative)
    def _keep(self, message: KeepAlternative) -> None:
        session = self.chats.get(message.session_id)
        if session is None:
            return
        try:
            self.chats.keep(session, message.number)
        except ValueError as err:
            self.say(str(err), "error")
            return
        if session is self.current:
            self.query_one(PromptInput).focus()

    @on(CopyText)
    def _copy(self, message: CopyText) -> None:
        self.copy_to_clipboard(message.text)
        self.say(f"copied the {message.what} ({len(message.text):,} characters)")

    # -- command palette ---------------------------------------------------------------------------
    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield from palette_commands(self)

    def set_alt_mode(self, kind: str) -> None:
        """Ask for the current session's next reply as one reply, samples or a beam."""
        if self.current is not None:
            self.chats.set_alt_mode(self.current, AltMode(kind, self.current.alt_mode.k))


def run_app(model: str | None = None, config: EngineConfig | None = None,
            settings: Settings | None = None, personas_dirs: list[Path] | None = None) -> None:
    """Run the chat UI until the user quits."""
    ChatApp(model, config, settings, personas_dirs).run()
