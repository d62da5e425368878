"""TypingGoesToTheBox: a focusable widget with keys of its own (a message, the alternatives
panes) that sends typing on to the message box instead of losing it or acting on it.

A printable key that is not one of the live bindings goes to the box, the focus with it; so do
the keys that follow it in the same burst (a paste, or ``/keep 1`` typed fast: one read of the
terminal), those that would be the widget's own keys too: the focus moves at once, and a key
that reaches the widget after the focus left is passed on to where the focus is now. A bound
key runs its action at once, in its turn.
"""

from __future__ import annotations

from textual import events
from textual.widget import Widget

from chatpage.ui.widgets.prompt_input import PromptInput, is_chord

BURST_S = 0.01
"""Keys this close together came in one read of the terminal (a paste, a burst of typing): not
a person pressing one key, then another."""


class TypingGoesToTheBox(Widget):
    """Mixed into a focusable widget (before its container class)."""

    _last_key_at = 0.0

    async def _on_key(self, event: events.Key) -> None:
        burst = event.time - self._last_key_at < BURST_S
        self._last_key_at = event.time
        typed = event.is_printable and not is_chord(event.key)
        bound = self.screen.active_bindings.get(event.key)
        if self.app.focused is not self or (typed and (burst or bound is None)):
            event.stop()
            event.prevent_default()
            self.hand_over(events.Key(event.key, event.character))
        elif bound is not None and bound.enabled:
            # the key's action, now: a key after it that moves the focus must not find its
            # binding looked up from there (bubbled up, it would be)
            event.stop()
            event.prevent_default()
            await self.app.run_action(bound.binding.action, bound.node)

    def hand_over(self, key: events.Key | None) -> None:
        """Give the focus back to the message box at once (so the keys still on their way here
        follow it there), with ``key``; a key that comes after the focus left goes to where it
        is now."""
        target = self.app.focused
        if target is self or target is None:
            target = self.screen.query_one(PromptInput)
            self.screen.set_focus(target)
        if key is not None:
            target.post_message(key)
