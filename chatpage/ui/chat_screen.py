"""ChatScreen: the sidebar of chats, the current chat, the message box and the gauge.

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

from rich.text import Text
from textual import on
from textual.app import ComposeResult, SuspendNotSupported
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import ContentSwitcher, Footer, Static, TextArea

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
from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.store import SessionRow
from chatpage.ui.actions import message as message_actions
from chatpage.ui.actions.action import Action
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.bindings import CHAT_BINDINGS, all_bindings
from chatpage.ui.clipboard import copy_text
from chatpage.ui.completion import completions
from chatpage.ui.errors import report
from chatpage.ui.external_editor import edit_text, editor_command
from chatpage.ui.history import SavedChats, Say
from chatpage.ui.screens.chat_search import ChatSearch
from chatpage.ui.screens.help import HelpScreen
from chatpage.ui.slash_commands import (
    ARGUMENTS,
    COMMAND_NAMES,
    help_rows,
    message_text,
    parse_command,
)
from chatpage.ui.text import clean
from chatpage.ui.tool_questions import ToolQuestions
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.block_gauge import BlockGauge
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList
from chatpage.ui.widgets.session_view import SessionView

T = TypeVar("T")
QUIT_AGAIN_S = 3.0
"""A second ctrl+c within this long quits."""
DRAFT_SAVE_S = 0.5
"""The draft is saved this long after the last change to it."""


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
        self.prompt = PromptInput(
            id="prompt", placeholder="Message (enter sends, ctrl+j new line, /help for commands)"
        )
        self._prompt_had_text = False
        self.prompt.completer = lambda text: completions(
            text, COMMAND_NAMES, ARGUMENTS, [p.name for p in self.personas]
        )
        self._completion_note = ""
        self._interrupted_at = -QUIT_AGAIN_S  # the last ctrl+c that did not quit
        self._draft_timer: Timer | None = None  # saves the draft once typing pauses
        self.questions = ToolQuestions(
            self, chats, lambda: self.current, say, self._sync_sidebar, self.prompt.post_message
        )

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
        self.questions.ask()  # the calls this chat waits on

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
                self.questions.drop_stale()
                if current:  # "stop" follows this chat only
                    self.refresh_bindings()
            case GenerationChanged():
                self._sync_sidebar()
                if current and not session.choosing:
                    self.prompt.focus()
            case AttachmentsChanged() | SettingsChanged() if current:
                self._show_prompt_info()
            case ToolAsked(_, run):
                self._sync_sidebar()  # its mark: a call waits for an answer
                self.questions.asked(session, run)

    def on_screen_resume(self) -> None:
        self.questions.ask()  # a call that waited for a dialog to close

    def _sync_sidebar(self) -> None:
        self.query_one(SessionList).sync(self.chats.sessions, self.current)

    def _show_prompt_info(self) -> None:
        session = self.current
        text = Text(clean(self._completion_note) + ("  " if self._completion_note else ""))
        if session is not None:
            if session.editing is not None and session.editing in session.entries:
                number = session.entries.index(session.editing) + 1
                text.append(f"editing message {number} — esc to cancel  ", "bold")
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
            self._completion_note = "tab: " + " · ".join(
                o.rsplit(" ", 1)[-1] or o.strip() for o in message.options[:12]
            )
            self._show_prompt_info()

    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self) -> None:
        if self._draft_timer is not None:
            self._draft_timer.stop()
        self._draft_timer = self.set_timer(DRAFT_SAVE_S, self._save_draft)
        if self._completion_note:
            self._completion_note = ""
            self._show_prompt_info()
        has_text = bool(self.prompt.text)
        if has_text != self._prompt_had_text:  # the editing keys change hands
            self._prompt_had_text = has_text
            self.refresh_bindings()

    def _save_draft(self) -> None:
        """Save the chat on show's draft as it is now (a crash loses at most DRAFT_SAVE_S of
        typing, and never brings back text that was deleted)."""
        self._draft_timer = None
        session = self.current
        if session is not None and session.draft != self.prompt.text:
            session.draft = self.prompt.text
            self.saved.save_draft(session)

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
                self._show_prompt_info()  # an edit is sent: no longer pending
            prompt.take()
            if not session.history or session.history[-1] != text:
                session.history.append(text)
            if command is not None:
                await self.perform(command.action, command.arg)
        except Exception as err:  # a UserError is advice; anything else a bug, logged
            slash = text.lstrip().startswith("/")
            report(err, f"running {text.split()[0]}" if slash else "sending a message", self.say)
            if not prompt.text:  # a command that failed comes back to be fixed
                prompt.load_text(text)
                prompt.move_cursor(prompt.document.end)

    def put_back(self, text: str) -> None:
        """Put ``text`` in the message box to be edited and sent again."""
        prompt = self.prompt
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        self.set_focus(prompt)  # at once: keys already on their way follow the text

    def edit_draft(self) -> None:
        """Edit the draft in $EDITOR: the app steps aside until the editor exits."""
        command = editor_command()
        try:
            with self.app.suspend():
                text = edit_text(self.prompt.text, command)
        except SuspendNotSupported:
            self.say(
                "this terminal cannot hand the screen to an editor; the draft stays here", "warning"
            )
            return
        self.put_back(text)

    # -- actions ----------------------------------------------------------------------------------
    async def perform(self, action: Action, arg: str | None = None) -> None:
        """Run ``action`` on this screen (``arg``: what followed its slash command, None from a
        key or the palette), unless it is not live now; UserError is a one-line problem."""
        if self._live(action):
            await action.run(self, arg)

    async def act(self, action: Action, arg: str | None = None) -> None:
        """`perform`, saying a problem instead of raising it (keys and the palette)."""
        await self._guard(lambda: self.perform(action, arg), f"running {action.id}")

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

    async def _guard(self, run: Callable[[], Awaitable[None] | None], where: str) -> None:
        """Run ``run``; what it raises is reported (`chatpage.ui.errors`), not raised."""
        try:
            done = run()
            if done is not None:
                await done
        except Exception as err:
            report(err, where, self.say)

    def dialog(self, flow: Callable[[], Awaitable[None]]) -> None:
        """Run ``flow`` as this screen's dialog worker (a newer one replaces it)."""
        self.run_worker(self._guard(flow, "in a dialog"), exclusive=True, group="dialog")

    async def ask(self, screen: Screen[T]) -> T | None:
        """Show ``screen`` and wait for its answer (in a `dialog` flow)."""
        return await self.app.push_screen_wait(screen)

    def search(self, term: str = "") -> None:
        """The search dialog; the hit picked opens its chat."""

        async def find() -> None:
            hit = await self.ask(ChatSearch(self.saved.store.search, term))
            if hit is not None:
                self.open_saved(hit.session_id)

        self.dialog(find)

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

    # -- the messages -----------------------------------------------------------------------------
    def toggle_thinking(self) -> bool:
        """Open or fold a reply's thinking in the chat on show (see `TranscriptView`)."""
        if self.current is None:
            return False
        return self.session_view(self.current).transcript.toggle_thinking()

    def focus_message(self, step: int) -> None:
        """Move the focus through the current chat's messages; past the last: the box."""
        if self.current is None:
            return
        if not self.session_view(self.current).transcript.focus_step(step):
            self.prompt.focus()

    @on(MessageView.Edit)
    async def _edit(self, message: MessageView.Edit) -> None:
        await self._guard(lambda: message_actions.edit(self, message.entry), "editing a message")

    @on(MessageView.Regenerate)
    async def _regenerate(self, message: MessageView.Regenerate) -> None:
        await self._guard(
            lambda: message_actions.regenerate(self, message.entry), "regenerating a reply"
        )

    @on(MessageView.Switch)
    async def _switch(self, message: MessageView.Switch) -> None:
        await self._guard(
            lambda: message_actions.switch(self, message.entry, message.step), "switching versions"
        )

    @on(MessageView.Left)
    async def _left(self) -> None:
        """Escape on a message: the box has the focus again; a reply in progress stops too
        (escape is the stop key)."""
        await self.act(BY_ID["stop"])

    def focus_entry(self, entry: Entry) -> None:
        """Focus the message of ``entry`` in the chat on show."""
        if self.current is not None:
            self.session_view(self.current).transcript.focus_entry(entry)

    @on(MessageView.Delete)
    def _delete(self, message: MessageView.Delete) -> None:
        message_actions.delete(self, message.entry)

    @on(MessageView.CopyCode)
    def _copy_code(self, message: MessageView.CopyCode) -> None:
        message_actions.copy_code(self, message.blocks)

    @on(MessageView.Copy)
    def _copy(self, message: MessageView.Copy) -> None:
        self.copy_text(message.text, message.what)

    @on(AlternativesView.Keep)
    def _keep(self, message: AlternativesView.Keep) -> None:
        session = self.chats.get(message.session_id)
        if session is None:
            return
        try:
            self.chats.requests.keep(session, message.number)
        except Exception as err:
            report(err, "keeping an alternative", self.say)
            return
        if session is self.current:
            self.prompt.focus()

    def copy_text(self, text: str, what: str) -> None:
        copy_text(self, text, what, self.say)
