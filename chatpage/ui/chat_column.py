"""ChatColumn: the chat on show (a switcher of session views, one per open chat) over the message
box; what the keys of its messages and alternatives panes ask for is run here, on the chat
screen's `Controls` (the handlers are `chatpage.ui.actions.message`'s)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import AwaitMount
from textual.widgets import ContentSwitcher, TextArea

from chatpage.chat.entry import Entry
from chatpage.ui.actions import message as message_actions
from chatpage.ui.actions.action import Controls
from chatpage.ui.actions.table import BY_ID
from chatpage.ui.errors import guarded, report
from chatpage.ui.message_box import MessageBox
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.prompt_input import PromptInput
from chatpage.ui.widgets.session_view import SessionView
from chatpage.ui.widgets.transcript import TranscriptView


class ChatColumn(Vertical):
    """The column right of the sidebar; ``controls`` is what its keys act on, ``box`` the
    message box it shows."""

    def __init__(self, controls: Controls, box: MessageBox, id: str) -> None:
        super().__init__(id=id)
        self.controls = controls
        self.box = box

    def compose(self) -> ComposeResult:
        yield ContentSwitcher(id="sessions")
        yield self.box.info
        yield self.box.prompt

    def add(self, view: SessionView) -> AwaitMount:
        """Mount a chat's view, hidden until `show`n."""
        view.display = False
        return self.query_one(ContentSwitcher).mount(view)

    def show(self, view: SessionView) -> None:
        """Show ``view`` (of the chat now on show) instead of the one shown."""
        self.query_one(ContentSwitcher).current = view.id

    def _transcript(self) -> TranscriptView | None:
        """The transcript of the chat on show (None before one is shown)."""
        shown = self.query_one(ContentSwitcher).visible_content
        return shown.transcript if isinstance(shown, SessionView) else None

    def toggle_thinking(self) -> bool:
        """Open or fold a reply's thinking in the chat on show (see `TranscriptView`)."""
        transcript = self._transcript()
        return transcript is not None and transcript.toggle_thinking()

    def focus_message(self, step: int) -> None:
        """Move the focus through the chat on show's messages; past the last: the box."""
        transcript = self._transcript()
        if transcript is not None and not transcript.focus_step(step):
            self.box.prompt.focus()

    def focus_entry(self, entry: Entry) -> None:
        """Focus the message of ``entry`` in the chat on show."""
        transcript = self._transcript()
        if transcript is not None:
            transcript.focus_entry(entry)

    @on(PromptInput.Completed)
    def _completed(self, message: PromptInput.Completed) -> None:
        self.box.completed(message.options)

    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self) -> None:
        self.box.changed()

    @on(MessageView.Edit)
    async def _edit(self, message: MessageView.Edit) -> None:
        c = self.controls
        await guarded(lambda: message_actions.edit(c, message.entry), "editing a message", c.say)

    @on(MessageView.Regenerate)
    async def _regenerate(self, message: MessageView.Regenerate) -> None:
        c = self.controls
        await guarded(
            lambda: message_actions.regenerate(c, message.entry), "regenerating a reply", c.say
        )

    @on(MessageView.Switch)
    async def _switch(self, message: MessageView.Switch) -> None:
        c = self.controls
        await guarded(
            lambda: message_actions.switch(c, message.entry, message.step),
            "switching versions",
            c.say,
        )

    @on(MessageView.Left)
    async def _left(self) -> None:
        """Escape on a message: the box has the focus again; a reply in progress stops too
        (escape is the stop key)."""
        await self.controls.act(BY_ID["stop"])

    @on(MessageView.Delete)
    def _delete(self, message: MessageView.Delete) -> None:
        message_actions.delete(self.controls, message.entry)

    @on(MessageView.CopyCode)
    def _copy_code(self, message: MessageView.CopyCode) -> None:
        message_actions.copy_code(self.controls, message.blocks)

    @on(MessageView.Copy)
    def _copy(self, message: MessageView.Copy) -> None:
        self.controls.copy_text(message.text, message.what)

    @on(AlternativesView.Keep)
    def _keep(self, message: AlternativesView.Keep) -> None:
        session = self.controls.chats.get(message.session_id)
        if session is None:
            return
        try:
            self.controls.chats.requests.keep(session, message.number)
        except Exception as err:
            report(err, "keeping an alternative", self.controls.say)
            return
        if session is self.controls.current:
            self.box.prompt.focus()
