"""The table's rows of the actions on the chats themselves (open, close, move between, find,
export, delete), after the help's: the first rows of `chatpage.ui.actions.table`."""

from __future__ import annotations

from chatpage.ui.actions import sessions
from chatpage.ui.actions.action import Action, PaletteEntry
from chatpage.ui.history import EXPORT_NAMES

ROWS: tuple[Action, ...] = (
    Action(
        "help",
        "Help",
        sessions.show_help,
        key="f1",
        app=True,
        slash="help",
        usage="/help",
        help="show keys and commands",
    ),
    # -- the chats
    Action(
        "new_session",
        "New chat",
        sessions.new_session,
        key="ctrl+n",
        slash="new",
        usage="/new [PERSONA]",
        argument="persona",
        help="open a new chat (picks a persona when none is named)",
    ),
    Action(
        "close_session", "Close", sessions.close_session, key="ctrl+w", priority=True, yields=True
    ),
    Action(
        "next_session",
        "Next chat",
        sessions.step(+1),
        key="ctrl+tab,ctrl+pagedown",
        show=False,
        priority=True,
    ),
    Action(
        "prev_session",
        "Previous chat",
        sessions.step(-1),
        key="ctrl+shift+tab,ctrl+pageup",
        show=False,
        priority=True,
    ),
    *(
        Action(
            f"goto_session_{n}",
            f"Chat {n}",
            sessions.goto(n),
            key=f"alt+{n}",
            show=False,
            palette=(),
        )
        for n in range(1, 10)
    ),
    Action(
        "clear",
        "Clear",
        sessions.clear,
        slash="clear",
        usage="/clear",
        help="empty this chat's transcript",
    ),
    Action(
        "rename",
        "Rename",
        sessions.rename,
        slash="title",
        usage="/title TEXT",
        help="rename this chat",
    ),
    Action(
        "search_history",
        "Search chats",
        sessions.search,
        key="ctrl+f",
        slash="search",
        usage="/search [WORDS]",
        help="search your saved chats (ctrl+f)",
    ),
    Action(
        "export",
        "Export",
        sessions.export,
        slash="export",
        usage="/export md|json",
        help="write this chat to a file as Markdown or JSON",
        palette=tuple(
            PaletteEntry(
                f"Export chat as {name}", "write this chat to a file in the current folder", fmt
            )
            for fmt, name in EXPORT_NAMES.items()
        ),
    ),
    Action(
        "delete_session",
        "Delete chat",
        sessions.delete_session,
        palette=(
            PaletteEntry("Delete chat", "delete this chat from the saved chats (asks first)"),
        ),
    ),
)
