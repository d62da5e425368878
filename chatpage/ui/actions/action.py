"""What one user action is (`Action`), and what its handler is given (`Controls`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from textual.screen import Screen

from chatpage.chat.chats import Chats
from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona
from chatpage.ui.history import SavedChats, Say

T = TypeVar("T")
Argument = Literal["", "persona", "path"]
"""What tab completes in a slash command's argument: nothing, a persona name, a file path."""


class Box(Protocol):
    """The message box, as a handler uses it."""

    def put_back(self, text: str) -> None:
        """Put ``text`` in the message box to be edited and sent again."""

    def edit_draft(self) -> None:
        """Edit the draft in the user's external editor."""


class Column(Protocol):
    """The messages of the chat on show, as a handler uses them."""

    def focus_message(self, step: int) -> None:
        """Move the focus through the messages on show; past the last: the message box."""

    def focus_entry(self, entry: Entry) -> None:
        """Focus the message of ``entry`` (in the chat on show)."""

    def toggle_thinking(self) -> bool:
        """Open or fold a reply's thinking (the focused one's, else the last that thought);
        False when no reply on show has any."""


class Controls(Protocol):
    """What a handler acts on: the open chats and the one on show, the saved chats, the
    personas, and the chat screen's own parts (its dialogs, the messages on show and the
    message box)."""

    chats: Chats
    saved: SavedChats
    personas: list[Persona]
    current: ChatSession | None
    say: Say
    default_persona: Callable[[], Persona]
    key_for: Callable[[str], str | None]
    """The key(s) of a binding id after the user's keymap."""

    async def open_session(self, persona: Persona) -> ChatSession: ...
    async def close_session(self, session: ChatSession) -> None: ...
    def open_saved(self, store_id: int) -> ChatSession | None: ...
    def step(self, step: int) -> None: ...
    def reload_personas(self) -> None: ...

    async def act(self, action: Action, arg: str | None = None) -> None:
        """Run ``action`` as its key does (a problem is said, not raised)."""

    def dialog(self, flow: Callable[[], Awaitable[None]]) -> None:
        """Run ``flow`` as the one dialog flow (it may `ask`); a newer one replaces it."""

    async def ask(self, screen: Screen[T]) -> T | None:
        """Show the dialog ``screen`` and wait for its answer (only inside `dialog`)."""

    @property
    def box(self) -> Box: ...
    @property
    def column(self) -> Column: ...

    def toggle_sidebar(self) -> None: ...
    def copy_text(self, text: str, what: str) -> None:
        """Copy ``text`` to the clipboard and say where it went."""

    def show_help(self) -> None: ...
    def switch_model(self, target: str | None) -> None:
        """Switch to the model at ``target`` ("" for the default; None: pick one)."""

    def quit(self) -> None: ...
    def interrupt(self) -> None:
        """ctrl+c: copy a selection, else stop the reply, else quit when pressed twice."""


Handler = Callable[[Controls, str | None], Awaitable[None]]
"""What an action does: ``handler(controls, arg)``; ``arg`` is what follows the slash command,
or None when the action runs from its key or the command palette."""
SessionHandler = Callable[[Controls, ChatSession, str | None], Awaitable[None]]


def on_chat(run: SessionHandler) -> Handler:
    """A handler that acts on the chat on show (and does nothing while there is none)."""

    async def handler(controls: Controls, arg: str | None) -> None:
        if controls.current is not None:
            await run(controls, controls.current, arg)

    handler.__doc__ = run.__doc__
    return handler


@dataclass(frozen=True)
class PaletteEntry:
    """One command palette entry of an action: its title, its help line, the ``arg`` it runs
    the action with (None: as its key does)."""

    title: str
    help: str
    arg: str | None = None


@dataclass(frozen=True)
class Action:
    """One thing the user can do, and every way to ask for it.

    ``id`` names it (for a key: the binding id that ``bindings:`` in config.yaml remaps);
    ``title`` is its name in the footer, the help's key table and the command palette.
    ``key`` is the default key (Textual's comma-separated form); ``show`` puts it in the
    footer; ``priority`` makes it work wherever the focus is, and ``yields`` hands it to the
    message box while the box has focus and text (ctrl+w deletes a word there); ``app`` binds
    it on every screen. ``active`` (None: always) says when the key is live. ``slash`` is the
    slash command (``aliases`` its other spellings; ``usage`` and ``help`` its help line;
    ``argument`` what tab completes after it).
    ``palette`` None gives an action with a key one palette entry (its title and key), else
    the entries listed.
    """

    id: str
    title: str
    run: Handler
    key: str = ""
    show: bool = True
    priority: bool = False
    yields: bool = False
    app: bool = False
    active: Callable[[Controls], bool] | None = None
    slash: str = ""
    aliases: tuple[str, ...] = ()
    usage: str = ""
    help: str = ""
    argument: Argument = ""
    palette: tuple[PaletteEntry, ...] | None = None

    def palette_entries(self, key_for: Callable[[str], str | None]) -> tuple[PaletteEntry, ...]:
        """The action's palette entries; ``key_for`` gives its key after the user's keymap."""
        if self.palette is not None:
            return self.palette
        if not self.key:
            return ()
        key = (key_for(self.id) or self.key).split(",")[0]
        return (PaletteEntry(self.title, f"{self.title} ({key})"),)
