"""ChatScreen: the sidebar of chats, the current chat, the message box and the gauge.

Which chat is shown is the reactive `current`; its watcher swaps the view, the draft and the
prompt history. Enter in the message box sends (or runs a slash command). Dialogs run as workers
(`push_screen_wait`), so a flow reads top to bottom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import ContentSwitcher, Footer, Static, TextArea

from chatpage.chat.chats import Chats
from chatpage.chat.commands import COMMAND_NAMES, Command, message_text, parse_command
from chatpage.chat.session import (
    AttachmentsChanged,
    BusyChanged,
    Change,
    ChatSession,
    GenerationChanged,
    SettingsChanged,
    TitleChanged,
)
from chatpage.config.personas import Persona
from chatpage.store import SessionRow
from chatpage.ui.bindings import CHAT_BINDINGS, EDITING_KEYS_YIELD
from chatpage.ui.chat_actions import ChatActions
from chatpage.ui.completion import completions
from chatpage.ui.history import SavedChats, Say
from chatpage.ui.persona_actions import PersonaActions
from chatpage.ui.screens.chat_search import ChatSearch
from chatpage.ui.slash_commands import run_slash_command
from chatpage.ui.text import clean
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList
from chatpage.ui.widgets.session_view import SessionView


class ChatScreen(ChatActions, PersonaActions, Screen[None]):
    """Many chats, one shown (`current`). It is given the open chats, the personas (a list the
    app keeps up to date, and how to reload it), how to say things, and at `begin` the store
    behind the chats."""

    BINDINGS = CHAT_BINDINGS
    current: reactive[ChatSession | None] = reactive(None, init=False)

    @dataclass
    class ModelWanted(Message):
        """Switch to the model at ``target`` ("" for the default model)."""

        target: str

    saved: SavedChats  # given at `begin`

    def __init__(self, chats: Chats, personas: list[Persona],
                 default_persona: Callable[[], Persona], say: Say,
                 reload_personas: Callable[[], None]) -> None:
        super().__init__()
        self.chats = chats
        self.reload_personas = reload_personas
        self.pinned: set[str] = set()
        """System prompts pinned in the engine (see `PersonaActions.pin`)."""
        self.personas = personas
        self.default_persona = default_persona
        self.say = say
        self.gauge = BlockGauge(id="gauge")
        self.prompt = PromptInput(id="prompt", placeholder="Message (enter sends, ctrl+j new "
                                                            "line, /help for commands)")
        self._prompt_had_text = False
        self.prompt.completer = lambda text: completions(
            text, COMMAND_NAMES, [p.name for p in self.personas])
        self._completion_note = ""

    # -- layout -----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield SessionList(id="sidebar")
            with Vertical(id="chat"):
                yield ContentSwitcher(id="sessions")
                yield Static(id="prompt-info")
                yield self.prompt
        yield self.gauge
        yield Footer()

    async def begin(self, saved: SavedChats) -> None:
        """Show the chats restored from ``saved`` (the most recent first), or a new one."""
        self.saved = saved
        restored = saved.start(self.personas, self.default_persona())
        for session in restored:
            self.add_session(session)
        if restored:
            self.current = restored[0]
        else:
            await self.open_session(self.default_persona())

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
        """A new chat with ``persona``, shown at once."""
        session = self.chats.open(persona)
        session.observers.append(self._session_changed)
        await self._mount_hidden(SessionView(session))
        self.current = session
        return session

    def add_session(self, session: ChatSession) -> None:
        """Add a session built elsewhere (a saved chat) to the sidebar; its view is mounted
        when it is first shown."""
        self.chats.adopt(session)
        session.observers.append(self._session_changed)
        self._sync_sidebar()

    def watch_current(self, old: ChatSession | None, new: ChatSession | None) -> None:
        prompt = self.prompt
        if old is not None and old in self.chats.sessions:
            old.draft = prompt.text
            self.saved.save_draft(old)
        if new is None:
            return
        self.query_one(ContentSwitcher).current = self.session_view(new).id
        prompt.load_text(new.draft)
        prompt.move_cursor(prompt.document.end)
        prompt.use_prompts(new.history)
        self._sync_sidebar()
        self._show_prompt_info()
        self.refresh_bindings()
        panes = self.session_view(new).transcript.alternatives
        (panes if panes is not None else prompt).focus()  # this screen's focus, under a dialog too

    async def close_session(self, session: ChatSession) -> None:
        """Close ``session`` (it stays saved, with its draft); another chat is shown."""
        index = self.chats.sessions.index(session)
        if session is self.current:
            session.draft = self.prompt.text
        self.saved.save_draft(session)
        self.chats.close(session)
        await self.query(f"#session-{session.id}").remove()
        if not self.chats.sessions:
            await self.open_session(self.default_persona())
        elif session is self.current:
            self.current = self.chats.sessions[min(index, len(self.chats.sessions) - 1)]
        else:
            self._sync_sidebar()

    def open_saved(self, store_id: int) -> ChatSession | None:
        """Switch to a saved chat, opening it again if it was closed."""
        session = self.saved.find_open(store_id)
        if session is None:
            session = self.saved.reopen(store_id, self.personas, self.default_persona())
            if session is None:
                return None
            self.add_session(session)
        self.current = session
        return session

    def closed_chats(self) -> list[SessionRow]:
        return self.saved.closed_chats()

    def _session_changed(self, session: ChatSession, change: Change) -> None:
        current = session is self.current
        match change:
            case TitleChanged():
                self._sync_sidebar()
            case BusyChanged():
                self._sync_sidebar()
                if current:  # "stop" follows this chat only
                    self.refresh_bindings()
            case GenerationChanged():
                self._sync_sidebar()
                if current and not session.choosing:
                    self.prompt.focus()
            case AttachmentsChanged() | SettingsChanged() if current:
                self._show_prompt_info()

    def _sync_sidebar(self) -> None:
        self.query_one(SessionList).sync(self.chats.sessions, self.current)

    def _show_prompt_info(self) -> None:
        session = self.current
        text = Text(clean(self._completion_note) + ("  " if self._completion_note else ""))
        if session is not None:
            if session.alt_mode.kind != "off":
                text.append(f"next reply: {session.alt_mode.describe()}  ", "bold")
            for attachment in session.attachments:
                text.append(f"📎 {clean(attachment.name)} ({len(attachment.text):,} chars)  ")
        info = self.query_one("#prompt-info", Static)
        info.update(text)
        info.display = bool(text.plain)

    @on(SessionList.Selected)
    def _selected(self, message: SessionList.Selected) -> None:
        session = self.chats.get(message.session_id)
        if session is not None:
            self.current = session

    def step(self, step: int) -> None:
        """Show the next (+1) or previous (-1) chat in the sidebar's order."""
        sessions = self.chats.sessions
        if self.current is not None and len(sessions) > 1:
            index = sessions.index(self.current)
            self.current = sessions[(index + step) % len(sessions)]

    # -- the message box --------------------------------------------------------------------------
    @on(PromptInput.Submitted)
    async def _submitted(self, message: PromptInput.Submitted) -> None:
        await self.submit_prompt(message.text)

    @on(PromptInput.Completed)
    def _completed(self, message: PromptInput.Completed) -> None:
        if len(message.options) > 1:
            self._completion_note = "tab: " + " · ".join(o.rsplit(" ", 1)[-1] or o.strip()
                                                        for o in message.options[:12])
            self._show_prompt_info()

    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self) -> None:
        if self._completion_note:
            self._completion_note = ""
            self._show_prompt_info()
        has_text = bool(self.prompt.text)
        if has_text != self._prompt_had_text:  # the editing keys change hands
            self._prompt_had_text = has_text
            self.refresh_bindings()

    async def submit_prompt(self, text: str) -> None:
        """What enter in the prompt does: run a slash command or send a message."""
        session = self.current
        if session is None or (not text.strip() and not session.attachments):
            return
        prompt = self.prompt
        try:
            command = parse_command(text)
            if command is None:
                self.chats.send(session, message_text(text))
            prompt.take()
            if not session.history or session.history[-1] != text:
                session.history.append(text)
            if command is not None:
                await self.run_command(command)
        except ValueError as err:  # ChatError included: one line for the user
            self.say(str(err), "error")
            if not prompt.text:  # a command that failed comes back to be fixed
                prompt.load_text(text)
                prompt.move_cursor(prompt.document.end)

    async def run_command(self, command: Command) -> None:
        """Run a slash command on the current session (ValueError: a one-line problem)."""
        await run_slash_command(self, command)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in EDITING_KEYS_YIELD and self.focused is self.prompt and self.prompt.text:
            return None  # the key edits the text instead (and the footer shows it disabled)
        if action == "stop":
            return True if self.current is not None and self.current.streaming else None
        return True

    @on(AlternativesView.Keep)
    def _keep(self, message: AlternativesView.Keep) -> None:
        session = self.chats.get(message.session_id)
        if session is None:
            return
        try:
            self.chats.keep(session, message.number)
        except ValueError as err:
            self.say(str(err), "error")
            return
        if session is self.current:
            self.prompt.focus()

    @work(exclusive=True, group="dialog")
    async def search(self, term: str = "") -> None:
        """The search dialog; the hit picked opens its chat."""
        hit = await self.app.push_screen_wait(ChatSearch(self.saved.store.search, term))
        if hit is not None:
            self.open_saved(hit.session_id)
