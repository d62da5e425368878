"""ChatActions: what the chat screen's keys do (one half of `ChatScreen`, kept apart for size).

Dialogs are workers that wait for their answer (`push_screen_wait`); copying goes through
`chatpage.ui.clipboard` and says where the text went.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from textual import work
from textual.app import SuspendNotSupported

from chatpage.chat.chats import Chats
from chatpage.chat.session import AltMode, ChatSession, SamplingSettings
from chatpage.config.personas import Persona
from chatpage.ui.clipboard import copy_to_system, has_system_clipboard
from chatpage.ui.external_editor import edit_text, editor_command
from chatpage.ui.history import SavedChats
from chatpage.ui.screens.code_picker import CodeBlockPicker
from chatpage.ui.screens.confirm import Confirm
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.sampling_settings import SamplingSettingsScreen
from chatpage.ui.text import code_blocks
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_list import SessionList

if TYPE_CHECKING:
    from textual.app import App

_ALT_CYCLE = {"off": "samples", "samples": "beam", "beam": "off"}
OSC52_NOTE = "the terminal's clipboard (OSC 52: tmux needs set-clipboard on, some terminals drop it)"


class ChatActions:
    """Actions of `ChatScreen`; it provides the attributes declared here."""

    chats: Chats
    saved: SavedChats
    personas: list[Persona]
    current: ChatSession | None
    prompt: PromptInput
    default_persona: Callable[[], Persona]
    say: Callable[..., None]
    app: App

    # -- chats ------------------------------------------------------------------------------------
    @work(exclusive=True, group="dialog")
    async def action_new_session(self) -> None:
        persona = await self.app.push_screen_wait(
            PersonaPicker(self.personas, self.default_persona()))
        if persona is not None:
            await self.open_session(persona)  # type: ignore[attr-defined]

    async def action_close_session(self) -> None:
        """Close the current chat; it stays saved (see `chatpage.ui.history`)."""
        if self.current is not None:
            await self.close_session(self.current)  # type: ignore[attr-defined]

    @work(exclusive=True, group="dialog")
    async def action_delete_session(self) -> None:
        """Ask, then delete the current chat from the store and close it."""
        session = self.current
        if session is None:
            return
        saved = ("It is removed from the saved chats; this cannot be undone."
                 if session.store_id is not None else "It has no messages yet.")
        yes = await self.app.push_screen_wait(
            Confirm(f"Delete the chat {session.title!r}?", saved, "Delete"))
        if yes and session in self.chats.sessions:
            self.saved.delete(session)
            await self.close_session(session)  # type: ignore[attr-defined]
            self.say(f"deleted the chat {session.title!r}")

    def action_search_history(self) -> None:
        self.search()  # type: ignore[attr-defined]

    def action_export(self, fmt: str) -> None:
        if self.current is not None:
            self.saved.export(self.current, fmt)

    def action_next_session(self) -> None:
        self.step(+1)  # type: ignore[attr-defined]

    def action_prev_session(self) -> None:
        self.step(-1)  # type: ignore[attr-defined]

    def action_goto_session(self, number: int) -> None:
        if 1 <= number <= len(self.chats.sessions):
            self.current = self.chats.sessions[number - 1]

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(SessionList)  # type: ignore[attr-defined]
        sidebar.display = not sidebar.display

    # -- the current chat ----------------------------------------------------------------------------
    def _guard(self, run: Callable[[ChatSession], object]) -> None:
        if self.current is None:
            return
        try:
            run(self.current)
        except ValueError as err:
            self.say(str(err), "error")

    def action_stop(self) -> None:
        if self.current is not None:
            self.chats.stop(self.current)

    def action_regenerate(self) -> None:
        self._guard(self.chats.regenerate)

    def action_edit_last(self) -> None:
        def edit(session: ChatSession) -> None:
            self.put_back(self.chats.edit(session))

        self._guard(edit)

    def put_back(self, text: str) -> None:
        """Put ``text`` in the message box to be edited and sent again."""
        prompt = self.prompt
        prompt.load_text(text)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    def action_focus_message(self, step: int) -> None:
        """Move the focus through the current chat's messages; past the last: the box."""
        if self.current is None:
            return
        transcript = self.session_view(self.current).transcript  # type: ignore[attr-defined]
        if not transcript.focus_step(step):
            self.prompt.focus()

    def on_message_view_edit(self, message: MessageView.Edit) -> None:
        """Edit a message of yours: it goes back in the box, and sending it forks the chat
        there (what followed the original stays, as the other version)."""
        session, entry = self.current, message.entry
        if session is None or entry not in session.entries:
            return
        if entry.role != "user":
            self.say("only your own messages can be edited; ctrl+r asks for another reply",
                     "warning")
            return
        self._guard(lambda s: self.put_back(self.chats.edit(s, entry)))

    def on_message_view_regenerate(self, message: MessageView.Regenerate) -> None:
        """Ask again for a reply: the new one is another version of it (◀ ▶)."""
        session, entry = self.current, message.entry
        if session is None or entry not in session.entries:
            return
        if entry.role != "assistant":
            self.say("r asks again for a reply; e edits a message of yours", "warning")
            return
        self._guard(lambda s: self.chats.regenerate(s, entry))

    @work(exclusive=True, group="dialog")
    async def on_message_view_delete(self, message: MessageView.Delete) -> None:
        """Ask, then delete a message and everything after it (on every branch)."""
        session, entry = self.current, message.entry
        if session is None or entry not in session.entries:
            return
        after = len(session.entries) - session.entries.index(entry) - 1
        detail = (f"The {after} message(s) after it go too, on every branch." if after
                  else "It is the last message.") + " This cannot be undone."
        who = "your message" if entry.role == "user" else "this reply"
        if await self.app.push_screen_wait(Confirm(f"Delete {who}?", detail, "Delete")):
            if session in self.chats.sessions and entry in session.entries:
                self._guard(lambda s: self.chats.delete(s, entry))

    def on_message_view_switch(self, message: MessageView.Switch) -> None:
        """Show another version of a turn (◀ ▶ at a fork)."""
        session, entry = self.current, message.entry
        if session is not None and entry in session.entries:
            self._guard(lambda s: self.chats.switch(s, entry, message.step))

    def action_external_editor(self) -> None:
        """Edit the draft in $EDITOR: the app steps aside until the editor exits."""
        command = editor_command()
        try:
            with self.app.suspend():
                text = edit_text(self.prompt.text, command)
        except SuspendNotSupported:
            self.say("this terminal cannot hand the screen to an editor; the draft stays here",
                     "warning")
            return
        except ValueError as err:
            self.say(str(err), "error")
            return
        self.put_back(text)

    def action_cycle_alternatives(self) -> None:
        session = self.current
        if session is not None:
            mode = session.alt_mode
            self.chats.set_alt_mode(session, AltMode(_ALT_CYCLE[mode.kind], mode.k))

    @work(exclusive=True, group="dialog")
    async def action_sampling_settings(self) -> None:
        session = self.current
        if session is None:
            return
        settings: SamplingSettings | None = await self.app.push_screen_wait(
            SamplingSettingsScreen(session.sampling, session.persona))
        if settings is not None and session in self.chats.sessions:
            self.chats.set_sampling(session, settings)

    # -- copying ------------------------------------------------------------------------------------
    def action_copy_reply(self) -> None:
        reply = self.current.last("assistant") if self.current is not None else None
        if reply is None or not reply.content:
            self.say("there is no reply to copy yet", "warning")
            return
        self.copy_text(reply.content, "reply")

    def action_copy_code(self) -> None:
        reply = self.current.last("assistant") if self.current is not None else None
        blocks = code_blocks(reply.content) if reply is not None else []
        if not blocks:
            self.say("the last reply has no code block", "warning")
            return
        self.copy_text(blocks[-1], "code block")

    def on_message_view_copy(self, message: MessageView.Copy) -> None:
        self.copy_text(message.text, message.what)

    @work(exclusive=True, group="dialog")
    async def on_message_view_copy_code(self, message: MessageView.CopyCode) -> None:
        blocks = message.blocks
        if not blocks:
            self.say("this message has no code block", "warning")
            return
        block = blocks[0] if len(blocks) == 1 else await self.app.push_screen_wait(
            CodeBlockPicker(blocks))
        if block is not None:
            self.copy_text(block, "code block")

    def copy_text(self, text: str, what: str) -> None:
        """Copy ``text``: the app's own clipboard and OSC 52 at once; the system clipboard too
        where there is one (off the UI thread). The notice says which reached ``text``."""
        self.app.copy_to_clipboard(text)
        if not has_system_clipboard():
            self._copied(text, what, None)
        else:
            self._copy_to_system(text, what)

    @work(thread=True, group="clipboard")
    def _copy_to_system(self, text: str, what: str) -> None:
        how = copy_to_system(text)
        self.app.call_from_thread(self._copied, text, what, how)

    def _copied(self, text: str, what: str, system: str | None) -> None:
        where = f"the system clipboard ({system})" if system else OSC52_NOTE
        self.say(f"copied the {what} ({len(text):,} characters) to {where}")
