"""The table of user actions: the one list that the key bindings (`chatpage.ui.bindings`), the
slash commands (`chatpage.ui.slash_commands`), the help screen and the command palette
(`chatpage.ui.palette`) are built from, in this order: the footer, the help and the palette
list them so. Its rows are kept by kind: the chats' (`chat_rows`), the replies' and the
message box's (`reply_rows`), the settings', the model's and the app's (`setting_rows`). To
add an action, add its row there (and its handler next to those of its kind).
"""

from __future__ import annotations

from chatpage.ui.actions import chat_rows, reply_rows, setting_rows
from chatpage.ui.actions.action import Action

ACTIONS: tuple[Action, ...] = (*chat_rows.ROWS, *reply_rows.ROWS, *setting_rows.ROWS)
BY_ID = {action.id: action for action in ACTIONS}
BY_SLASH = {
    name: action for action in ACTIONS if action.slash for name in (action.slash, *action.aliases)
}
"""Every slash command's name and alias -> its action."""
