"""MessageBox: the message box's own state, held by the chat screen (which decides what enter
does with the text).

Each chat keeps its draft: the box's text is saved DRAFT_SAVE_S after typing pauses and when
another chat is shown, and the chat shown brings back its own draft and prompt history. The info
line above the box says what the next message carries: tab's choices, the message being edited,
the next reply's alternatives and the files attached.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import SuspendNotSupported
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Static

from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.ui.completion import completions
from chatpage.ui.external_editor import edit_text, editor_command
from chatpage.ui.history import SavedChats, Say
from chatpage.ui.slash_commands import ARGUMENTS, COMMAND_NAMES
from chatpage.ui.text import clean
from chatpage.ui.widgets.prompt_input import PromptInput

DRAFT_SAVE_S = 0.5
"""The draft is saved this long after the last change to it."""


class MessageBox:
    """The box (`prompt`) and its info line (`info`) on ``screen``, for ``current()``'s chat;
    drafts are saved in ``saved()``; tab completes persona names from ``personas``."""

    def __init__(
        self,
        screen: Screen[None],
        current: Callable[[], ChatSession | None],
        saved: Callable[[], SavedChats],
        personas: list[Persona],
        say: Say,
    ) -> None:
        self.screen = screen
        self.current = current
        self.saved = saved
        self.say = say
        self.prompt = PromptInput(
            id="prompt", placeholder="Message (enter sends, ctrl+j new line, /help for commands)"
        )
        self.prompt.completer = lambda text: completions(
            text, COMMAND_NAMES, ARGUMENTS, [p.name for p in personas]
        )
        self.info = Static(id="prompt-info")
        self._had_text = False
        self._completion_note = ""
        self._draft_timer: Timer | None = None  # saves the draft once typing pauses

    def show_info(self) -> None:
        """Say above the box what the next message carries (nothing: the line is hidden)."""
        session = self.current()
        text = Text(clean(self._completion_note) + ("  " if self._completion_note else ""))
        if session is not None:
            if session.editing is not None and session.editing in session.entries:
                number = session.entries.index(session.editing) + 1
                text.append(f"editing message {number} — esc to cancel  ", "bold")
            if session.alt_mode.kind != "off":
                text.append(f"next reply: {session.alt_mode.describe()}  ", "bold")
            for attachment in session.attachments:
                text.append(f"📎 {clean(attachment.name)} ({len(attachment.text):,} chars)  ")
        self.info.update(text)
        self.info.display = bool(text.plain)

    def completed(self, options: list[str]) -> None:
        """Tab found several ``options``: the info line lists them."""
        if len(options) > 1:
            self._completion_note = "tab: " + " · ".join(
                o.rsplit(" ", 1)[-1] or o.strip() for o in options[:12]
            )
            self.show_info()

    def changed(self) -> None:
        """The text changed: the draft is saved once typing pauses, tab's choices go, and the
        keys the box takes while it has text change hands."""
        if self._draft_timer is not None:
            self._draft_timer.stop()
        self._draft_timer = self.screen.set_timer(DRAFT_SAVE_S, self._save_draft)
        if self._completion_note:
            self._completion_note = ""
            self.show_info()
        has_text = bool(self.prompt.text)
        if has_text != self._had_text:
            self._had_text = has_text
            self.screen.refresh_bindings()

    def _save_draft(self) -> None:
        """Save the chat on show's draft as it is now (a crash loses at most DRAFT_SAVE_S of
        typing, and never brings back text that was deleted)."""
        self._draft_timer = None
        session = self.current()
        if session is not None and session.draft != self.prompt.text:
            self.keep_draft(session)

    def keep_draft(self, session: ChatSession) -> None:
        """Save the box's text as ``session``'s draft (the chat it holds, leaving)."""
        session.draft = self.prompt.text
        self.saved().save_draft(session)

    def show(self, session: ChatSession) -> None:
        """Hold ``session``'s draft and prompt history (it is the chat on show now)."""
        self.load(session.draft)
        self.prompt.use_prompts(session.history)
        self.show_info()

    def load(self, text: str) -> None:
        """Put ``text`` in the box, the cursor at its end."""
        self.prompt.load_text(text)
        self.prompt.move_cursor(self.prompt.document.end)

    def put_back(self, text: str) -> None:
        """Put ``text`` in the message box to be edited and sent again."""
        self.load(text)
        self.screen.set_focus(self.prompt)  # at once: keys already on their way follow the text

    def edit_draft(self) -> None:
        """Edit the draft in $EDITOR: the app steps aside until the editor exits."""
        command = editor_command()
        try:
            with self.screen.app.suspend():
                text = edit_text(self.prompt.text, command)
        except SuspendNotSupported:
            self.say(
                "this terminal cannot hand the screen to an editor; the draft stays here", "warning"
            )
            return
        self.put_back(text)
