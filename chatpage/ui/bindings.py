"""The app's key bindings, each with an id so config.yaml's ``bindings:`` can remap it.

`CHAT_BINDINGS` belong to the chat screen; `APP_BINDINGS` work on every screen. The alternatives
panes add ``keep_1`` .. ``keep_6`` (keys 1-6) while they have focus, and a focused message adds
the `MessageView` keys.

A few chat keys are also editing keys of the message box (ctrl+w deletes a word, ctrl+a goes to
the line start): they are priority bindings, so they work wherever the focus is, but while the
box has focus and text in it the box's meaning wins (`EDITING_KEYS_YIELD`).
"""

from __future__ import annotations

from textual.binding import Binding

APP_BINDINGS: list[Binding] = [
    Binding("f1", "help", "Help", id="help"),
]

CHAT_BINDINGS: list[Binding] = [
    Binding("ctrl+n", "new_session", "New chat", id="new_session"),
    Binding("ctrl+w", "close_session", "Close", id="close_session", priority=True),
    Binding("ctrl+tab,ctrl+pagedown", "next_session", "Next chat", show=False,
            id="next_session", priority=True),
    Binding("ctrl+shift+tab,ctrl+pageup", "prev_session", "Previous chat", show=False,
            id="prev_session", priority=True),
    *[Binding(f"alt+{n}", f"goto_session({n})", f"Chat {n}", show=False,
              id=f"goto_session_{n}") for n in range(1, 10)],
    Binding("escape", "stop", "Stop", id="stop"),
    Binding("ctrl+r", "regenerate", "Regenerate", id="regenerate"),
    Binding("alt+e", "edit_last", "Edit last", show=False, id="edit_last"),
    Binding("ctrl+a", "cycle_alternatives", "Alternatives", id="cycle_alternatives",
            priority=True),
    Binding("alt+c", "copy_reply", "Copy reply", show=False, id="copy_reply"),
    Binding("alt+k", "copy_code", "Copy code", show=False, id="copy_code"),
    Binding("f2", "sampling_settings", "Sampling", id="sampling_settings"),
    Binding("ctrl+f", "search_history", "Search chats", id="search_history"),
    Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False, id="toggle_sidebar"),
    Binding("ctrl+e", "external_editor", "Editor", show=False, id="external_editor",
            priority=True),
    Binding("alt+up", "focus_message(-1)", "Previous message", show=False,
            id="focus_prev_message"),
    Binding("alt+down", "focus_message(1)", "Next message", show=False,
            id="focus_next_message"),
]

EDITING_KEYS_YIELD = frozenset({"close_session", "cycle_alternatives"})
"""Chat actions whose keys edit the message box instead while it has focus and text."""
