"""The app's key bindings, built from the table of actions; each has the action's id, so
config.yaml's ``bindings:`` can remap it.

A binding runs ``act('<id>')`` on its screen (`ChatScreen`) or on the app (an action marked
``app``: it works on every screen), which runs the action's handler. The alternatives panes add
``keep_1`` .. ``keep_6`` (keys 1-6) while they have focus, the transcript j / k, and a focused
message the `MessageView` keys: those stay with their widgets.

A few chat keys are also editing keys of the message box (ctrl+w deletes a word, ctrl+a goes to
the line start): they are priority bindings, so they work wherever the focus is, but while the
box has focus and text in it the box's meaning wins (the action's ``yields``).
"""

from __future__ import annotations

from textual.binding import Binding, BindingType

from chatpage.ui.actions.action import Action
from chatpage.ui.actions.table import ACTIONS
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.transcript import TranscriptView


def binding(action: Action) -> Binding:
    """The key binding of ``action`` (one with a key)."""
    return Binding(
        action.key,
        f"act({action.id!r})",
        action.title,
        show=action.show,
        id=action.id,
        priority=action.priority,
    )


APP_BINDINGS: list[BindingType] = [binding(a) for a in ACTIONS if a.key and a.app]
CHAT_BINDINGS: list[BindingType] = [binding(a) for a in ACTIONS if a.key and not a.app]


def all_bindings() -> list[Binding]:
    """Every binding with an id, wherever it lives (for the keymap and the help): the
    actions', then the keys of the widgets that have them while they have focus."""
    widgets = [*AlternativesView.BINDINGS, *TranscriptView.BINDINGS, *MessageView.BINDINGS]
    return [
        *(binding(a) for a in ACTIONS if a.key),
        *(b for b in widgets if isinstance(b, Binding) and b.id),
    ]
