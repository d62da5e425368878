"""ToolQuestions: the tool calls that wait for the user's answer, asked about one at a time, and
only in the chat on show.

A call in another chat never opens a dialog over what the user is doing: that chat is marked in
the sidebar (`SessionList`'s ``?``) and a notice names it; its dialog opens when the user goes
there. The dialog (`ToolApproval`) passes on typing that was under way when it opened.
"""

from __future__ import annotations

from collections.abc import Callable

from textual import events
from textual.screen import Screen

from chatpage.chat.chats import Chats
from chatpage.chat.entry import ToolRun
from chatpage.chat.session import ChatSession
from chatpage.chat.tool_turns import asked_tool
from chatpage.ui.history import Say
from chatpage.ui.screens.tool_approval import ToolApproval, tool_label


class ToolQuestions:
    """Asks on ``screen`` (the chat screen) about the calls of ``current()``'s chat;
    ``changed`` runs after an answer (the sidebar's marks); ``forward`` takes typing."""

    def __init__(
        self,
        screen: Screen[None],
        chats: Chats,
        current: Callable[[], ChatSession | None],
        say: Say,
        changed: Callable[[], None],
        forward: Callable[[events.Key], object],
    ) -> None:
        self.screen = screen
        self.chats = chats
        self.current = current
        self.say = say
        self.changed = changed
        self.forward = forward
        self.dialog: ToolApproval | None = None

    def asked(self, session: ChatSession, run: ToolRun) -> None:
        """``session``'s reply wants ``run`` run: ask now if it is on show, else say where."""
        if session is self.current():
            self.ask()
            return
        what = tool_label(run, asked_tool(session, run))
        self.say(f"chat {session.title!r} asks to run the tool {what}: go to it to answer")

    def ask(self) -> None:
        """Ask about the next call waiting in the chat on show, unless a dialog is up (this
        one, or another: then once that one closes)."""
        session = self.current()
        if self.dialog is not None or session is None or self.screen.app.screen is not self.screen:
            return
        waiting = session.tool_questions
        if not waiting:
            return
        run = waiting[0]

        def answered(answer: str | None) -> None:
            self.dialog = None
            self.chats.requests.tool_loop.answer(session, run, answer or "n")
            self.changed()
            self.ask()

        self.dialog = ToolApproval(run, asked_tool(session, run), session.title, self.forward)
        self.screen.app.push_screen(self.dialog, answered)

    def drop_stale(self) -> None:
        """Close the dialog of a call that was settled otherwise (its reply stopped)."""
        if self.dialog is not None and self.dialog.run.state != "asking":
            self.dialog.dismiss(None)
