"""PromptInput: the multi-line message box.

enter sends; ctrl+j (and shift+enter where the terminal reports it) adds a newline; up on the
first line and down on the last walk through the session's earlier prompts. A key with alt (or
ctrl) never types its character: it is the chat's key. tab on a slash
command line completes it (`completer`): the common prefix first, then each option in turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from chatpage.ui.completion import common_prefix

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")
MODIFIERS = frozenset({"alt", "ctrl", "super", "meta", "hyper"})


def is_chord(key: str) -> bool:
    """Whether ``key`` is a key with a modifier (``alt+e``): a terminal that sends alt+e as
    ESC e gives it the character ``e``, which is the chat's key here, never text."""
    return not MODIFIERS.isdisjoint(key.split("+")[:-1])


class PromptInput(TextArea):
    """A TextArea that submits on enter and recalls history."""

    @dataclass
    class Submitted(Message):
        """Enter: a message or a slash command."""

        text: str

    @dataclass
    class Completed(Message):
        """Tab found these ``options`` for the line (shown to the user when there are several)."""

        options: list[str]

    def __init__(self, **kwargs) -> None:
        super().__init__(
            soft_wrap=True,
            tab_behavior="focus",
            show_line_numbers=False,
            compact=True,
            highlight_cursor_line=False,
            **kwargs,
        )
        self.prompts: list[str] = []
        self._recall: int | None = None  # index into history while walking it
        self._draft = ""  # what was typed before walking the history
        self.completer: Callable[[str], list[str]] | None = None
        """The lines a slash-command line completes to (set by the screen)."""
        self._options: list[str] = []  # what repeated tabs step through

    def use_prompts(self, prompts: list[str]) -> None:
        """Walk ``prompts`` (a session's list, shared, appended to by the app)."""
        self.prompts = prompts
        self._recall = None

    async def _on_key(self, event: events.Key) -> None:
        key = event.key
        if key == "enter":
            self._stop(event)
            self.post_message(self.Submitted(self.text))
            return
        if key in NEWLINE_KEYS:
            self._stop(event)
            self.insert("\n")
            return
        if is_chord(key):  # not the text area's: on to the bindings (no "e" for alt+e)
            event.prevent_default()
            return
        if key == "tab" and self.text.startswith("/"):
            self._stop(event)  # a command line: tab never leaves the box
            self._complete()
            return
        row = self.wrapped_document.location_to_offset(self.cursor_location).y
        if key == "up" and row == 0 and self._walk(-1):
            self._stop(event)
            return
        if key == "down" and row >= self.wrapped_document.height - 1 and self._walk(+1):
            self._stop(event)
            return
        await super()._on_key(event)

    @staticmethod
    def _stop(event: events.Key) -> None:
        event.stop()
        event.prevent_default()

    def _walk(self, step: int) -> bool:
        """Show the previous (-1) or next (+1) prompt; False when there is nowhere to go."""
        if not self.prompts:
            return False
        if self._recall is None:
            if step > 0:
                return False
            self._draft = self.text
            index = len(self.prompts) - 1
        else:
            index = self._recall + step
        if index < 0:
            return True  # at the oldest: stay
        if index >= len(self.prompts):
            self._recall = None
            self._set(self._draft)
            return True
        self._recall = index
        self._set(self.prompts[index])
        return True

    def _complete(self) -> None:
        text = self.text
        if text in self._options:  # a further tab: the next option
            options = self._options
            self._set(options[(options.index(text) + 1) % len(options)])
            return
        options = self.completer(text) if self.completer is not None else []
        if not options:
            self._options = []
            return
        prefix = common_prefix(options)
        if len(options) == 1:
            self._set(options[0])
        elif len(prefix) > len(text):
            self._set(prefix)
        else:
            self._options = options
            self._set(options[0])
        self.post_message(self.Completed(options))

    def _set(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def take(self) -> str:
        """The text, clearing the box (and leaving history mode)."""
        text = self.text
        self._recall = None
        self.clear()
        return text
