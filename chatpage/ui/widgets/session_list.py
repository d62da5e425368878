"""SessionList: the sidebar of chats (title, persona, a marker while one is generating, another
while a tool call in it waits for the user's answer)."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import on
from textual.message import Message
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from chatpage.chat.session import ChatSession
from chatpage.ui.text import one_line

TITLE_WIDTH = 22


def marker(session: ChatSession) -> str:
    if session.tool_questions:  # a tool call waits for the user's answer
        return "? "
    if session.streaming:
        return "● "
    if session.choosing:
        return "◆ "
    return "  "


class SessionList(OptionList):
    """One option per session (id = session id); the highlight follows the current session."""

    @dataclass
    class Selected(Message):
        """The user picked session ``session_id``."""

        session_id: int

    def prompt(self, number: int, session: ChatSession) -> Text:
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(marker(session), "bold")
        text.append(f"{number}. " if number <= 9 else "   ", "dim")
        text.append(one_line(session.title, TITLE_WIDTH), "bold")
        text.append(f"\n     {one_line(session.persona.name, TITLE_WIDTH)}", "italic dim")
        return text

    def sync(self, sessions: list[ChatSession], current: ChatSession | None) -> None:
        """Show ``sessions`` in order and highlight ``current``."""
        ids = [str(s.id) for s in sessions]
        if [o.id for o in self.options] != ids:
            self.set_options(
                Option(self.prompt(i + 1, s), id=str(s.id)) for i, s in enumerate(sessions)
            )
        else:
            for i, s in enumerate(sessions):
                self.replace_option_prompt_at_index(i, self.prompt(i + 1, s))
        if current is not None and str(current.id) in ids:
            self.highlighted = ids.index(str(current.id))

    @on(OptionList.OptionSelected)
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Selected(int(event.option.id)))
