"""ChatScreen: the sidebar of chats, the chat column (`ChatColumn`: the chat on show over the
message box, a `MessageBox`) and the gauge.

Which chat is shown is the reactive `current`; its watcher swaps the view, the draft and the
prompt history. Enter in the message box sends (or runs a slash command). What the user asks
for, by key, slash command or the command palette, is an action of the table
(`chatpage.ui.actions`): the screen runs its handler, handing it itself as the `Controls` it
acts on (its layout, focus and dialogs). Dialogs run as workers (`push_screen_wait`), so a flow
reads top to bottom.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer

from chatpage.chat.changes import (
    AttachmentsChanged,
    BusyChanged,
    Change,
    GenerationChanged,
    SettingsChanged,
    TitleChanged,
    ToolAsked,
)
from chatpage.chat.chats import Chats
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.ui.actions.action import Action
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.bindings import CHAT_BINDINGS, all_bindings
from chatpage.ui.chat_column import ChatColumn
from chatpage.ui.clipboard import copy_text
from chatpage.ui.errors import guarded, report
from chatpage.ui.history import SavedChats, Say
from chatpage.ui.message_box import MessageBox
from chatpage.ui.screens.help import HelpScreen
from chatpage.ui.slash_commands import help_rows, message_text, parse_command
from chatpage.ui.tool_questions import ToolQuestions
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList
from chatpage.ui.widgets.session_view import SessionView

T = TypeVar("T")
QUIT_AGAIN_S = 3.0
"""A second ctrl+c within this long quits."""


class ChatScreen(Screen[None]):
    """Many chats, one shown (`current`). It is given the open chats, the personas (a list the
    app keeps up to date, and how to reload it), how to say things, the key of a binding id
    after the user's keymap, and at `begin` the store behind the chats."""

    BINDINGS = CHAT_BINDINGS
    current: reactive[ChatSession | None] = reactive(None, init=False)

    @dataclass
    class ModelWanted(Message):
        """Switch to the model at ``target`` ("" for the default model; None: pick one)."""

        target: str | None

    saved: SavedChats  # given at `begin`

    def __init__(
        self,
        chats: Chats,
        personas: list[Persona],
        default_persona: Callable[[], Persona],
        say: Say,
        reload_personas: Callable[[], None],
        key_for: Callable[[str], str | None],
    ) -> None:
        super().__init__()
        self.chats = chats
        self.reload_personas = reload_personas
        self.key_for = key_for
        self.personas = personas
        self.default_persona = default_persona
        self.say = say
        self.gauge = BlockGauge(id="gauge")
        self.box = MessageBox(self, lambda: self.current, lambda: self.saved, personas, say)
        self.prompt = self.box.prompt  # the box's text area
        self.column = ChatColumn(self, self.box, id="chat")
        self._interrupted_at = -QUIT_AGAIN_S  # the last ctrl+c that did not quit
        self.questions = ToolQuestions(
            self, chats, lambda: self.current, say, self._sync_sidebar, self.prompt.post_message
        )

    # -- layout -----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="main"):
            yield SessionList(id="sidebar")
            yield self.column
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
        self.column.add(view)
        return view

    async def open_session(self, persona: Persona) -> ChatSession:
        """A new chat with ``persona``, shown at once."""
        session = self.chats.open(persona)
        session.observers.append(self._session_changed)
        await self.column.add(SessionView(session))
        self.current = session
        return session

    def add_session(self, session: ChatSession) -> None:
        """Add a session built elsewhere (a saved chat) to the sidebar; its view is mounted
        when it is first shown."""
        self.chats.adopt(session)
        session.observers.append(self._session_changed)
        self._sync_sidebar()

    def watch_current(self, old: ChatSession | None, new: ChatSession | None) -> None:
        if old is not None and old in self.chats.sessions:
            self.box.keep_draft(old)
        if new is None:
            return
        self.column.show(self.session_view(new))
        self.box.show(new)
        self._sync_sidebar()
        self.refresh_bindings()
        panes = self.session_view(new).transcript.alternatives
        (
            panes if panes is not None else self.prompt
        ).focus()  # this screen's focus, under a dialog too
        self.questions.ask()  # the calls this chat waits on

    async def close_session(self, session: ChatSession) -> None:
        """Close ``session`` (it stays saved, with its draft); another chat is shown."""
        index = self.chats.sessions.index(session)
        if session is self.current:
            self.box.keep_draft(session)
        else:
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

    def _session_changed(self, session: ChatSession, change: Change) -> None:
        current = session is self.current
        match change:
            case TitleChanged():
                self._sync_sidebar()
            case BusyChanged():
                self._sync_sidebar()
                self.questions.drop_stale()
                if current:  # "stop" follows this chat only
                    self.refresh_bindings()
            case GenerationChanged():
                self._sync_sidebar()
                if current and not session.choosing:
                    self.prompt.focus()
            case AttachmentsChanged() | SettingsChanged() if current:
                self.box.show_info()
            case ToolAsked(_, run):
                self._sync_sidebar()  # its mark: a call waits for an answer
                self.questions.asked(session, run)

    def on_screen_resume(self) -> None:
        self.questions.ask()  # a call that waited for a dialog to close

    def _sync_sidebar(self) -> None:
        # (none while the app closes: a deferred batch of updates still reaches the chats, which
        # record it, after the screen's widgets are gone)
        for sidebar in self.query(SessionList):
            sidebar.sync(self.chats.sessions, self.current)

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
                self.box.show_info()  # an edit is sent: no longer pending
            prompt.take()
            if not session.history or session.history[-1] != text:
                session.history.append(text)
            if command is not None:
                await self.perform(command.action, command.arg)
        except Exception as err:  # a UserError is advice; anything else a bug, logged
            slash = text.lstrip().startswith("/")
            report(err, f"running {text.split()[0]}" if slash else "sending a message", self.say)
            if not prompt.text:  # a command that failed comes back to be fixed
                self.box.load(text)

    # -- actions ----------------------------------------------------------------------------------
    async def perform(self, action: Action, arg: str | None = None) -> None:
        """Run ``action`` on this screen (``arg``: what followed its slash command, None from a
        key or the palette), unless it is not live now; UserError is a one-line problem."""
        if self._live(action):
            await action.run(self, arg)

    async def act(self, action: Action, arg: str | None = None) -> None:
        """`perform`, saying a problem instead of raising it (keys and the palette)."""
        await guarded(lambda: self.perform(action, arg), f"running {action.id}", self.say)

    async def action_act(self, action_id: str) -> None:
        """What a key bound from the table runs (`chatpage.ui.bindings`)."""
        await self.act(BY_ID[action_id])

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "act" and parameters:
            return self._live(BY_ID[str(parameters[0])])
        return True

    def _live(self, action: Action) -> bool | None:
        """Whether ``action`` runs now; None (the footer shows it disabled) while its key is
        the message box's (the box has focus and text) or while it has nothing to act on."""
        if action.yields and self.focused is self.prompt and self.prompt.text:
            return None
        if action.active is not None and not action.active(self):
            return None
        return True

    def dialog(self, flow: Callable[[], Awaitable[None]]) -> None:
        """Run ``flow`` as this screen's dialog worker (a newer one replaces it)."""
        self.run_worker(guarded(flow, "in a dialog", self.say), exclusive=True, group="dialog")

    async def ask(self, screen: Screen[T]) -> T | None:
        """Show ``screen`` and wait for its answer (in a `dialog` flow)."""
        return await self.app.push_screen_wait(screen)

    def show_help(self) -> None:
        """The keys (after the user's keymap) and the slash commands."""
        keys = [(self.key_for(b.id) or "", b.id, b.description) for b in all_bindings() if b.id]
        self.app.push_screen(HelpScreen(keys, help_rows()))

    def switch_model(self, target: str | None) -> None:
        self.post_message(self.ModelWanted(target))

    def quit(self) -> None:
        self.app.exit()

    def interrupt(self) -> None:
        """ctrl+c: copy the text selected (in the box or on the screen); else stop the reply in
        progress; else quit, when pressed again within QUIT_AGAIN_S."""
        selected = self.prompt.selected_text if self.focused is self.prompt else ""
        selected = selected or self.get_selected_text() or ""
        if selected:
            self.copy_text(selected, "selection")
            return
        session, now = self.current, time.monotonic()
        if session is not None and session.streaming:
            self.chats.requests.stop(session)
            self.say("stopped the reply; ctrl+c again quits")
        elif now - self._interrupted_at < QUIT_AGAIN_S:
            self.quit()
            return
        else:
            self.say("ctrl+c again quits (or /quit)")
        self._interrupted_at = now

    def toggle_sidebar(self) -> None:
        sidebar = self.query_one(SessionList)
        sidebar.display = not sidebar.display

    def copy_text(self, text: str, what: str) -> None:
        copy_text(self, text, what, self.say)
