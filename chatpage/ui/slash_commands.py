"""Slash commands typed in the message box, parsed against the table of actions.

``/temp 0.7`` runs the action whose slash command (or alias) is ``temp`` with the argument
``0.7``; ``//text`` sends the message ``/text``. Every problem is a UserError with one line for
the user.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatpage.ui.actions.action import Action, Argument
from chatpage.ui.actions.table import ACTIONS, BY_SLASH
from chatpage.vocab import UserError

COMMAND_NAMES = frozenset(a.slash for a in ACTIONS if a.slash)
"""The slash commands' own names (tab completes these; aliases work too)."""
ARGUMENTS: dict[str, Argument] = {name: a.argument for name, a in BY_SLASH.items() if a.argument}
"""What tab completes after a slash command (by its names and aliases)."""


@dataclass(frozen=True)
class SlashCommand:
    """A slash command typed: its action and what followed its name."""

    action: Action
    arg: str


def parse_command(text: str) -> SlashCommand | None:
    """The command in ``text``, or None when it is a message (``//x`` is the message ``/x``)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    head, _, arg = stripped[1:].partition(" ")
    action = BY_SLASH.get(head.strip().lower())
    if action is None:
        raise UserError(
            f"unknown command /{head}; type /help for the list "
            "(start with // to send a message that begins with /)"
        )
    return SlashCommand(action, arg.strip())


def message_text(text: str) -> str:
    """What to send for a non-command line: ``//x`` becomes ``/x``."""
    stripped = text.lstrip()
    return stripped[1:] if stripped.startswith("//") else text


def help_rows() -> list[tuple[str, str]]:
    """(usage, help) of every slash command, for the help screen."""
    return [(a.usage, a.help) for a in ACTIONS if a.slash]
