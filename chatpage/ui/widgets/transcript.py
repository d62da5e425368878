"""Transcript: a session's messages, then its alternatives while they are on show.

It follows the stream (anchored to the bottom) unless the user scrolls up. The anchor is set only
once the messages overflow the view, so a short chat reads from the top. With the focus in it,
j/k move the focus to the next/previous message.
"""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widgets import Static

from chatpage.chat.session import ChatSession, Entry
from chatpage.engine.client import OutputDelta
from chatpage.ui.text import clean
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.streaming_markdown import StreamingMarkdown


class Transcript(VerticalScroll):
    """Message views for a session's entries."""

    BINDINGS = [
        Binding("j", "focus_step(1)", "Next message", show=False, id="transcript_next"),
        Binding("k", "focus_step(-1)", "Previous message", show=False, id="transcript_prev"),
    ]

    def __init__(self, session: ChatSession, **kwargs) -> None:
        super().__init__(**kwargs)
        self.session = session
        self._views: dict[int, MessageView] = {}  # id(entry) -> view

    def _view(self, entry: Entry) -> MessageView:
        speaker = "You" if entry.role == "user" else self.session.persona.name
        view = MessageView(entry, speaker)
        self._views[id(entry)] = view
        return view

    def compose(self):
        greeting = self.session.persona.greeting
        if greeting:
            yield Static(Text(clean(greeting)), classes="greeting")
        for entry in self.session.entries:
            yield self._view(entry)
        if self.session.choosing:
            yield AlternativesView(self.session.id, self.session.generation)

    def on_mount(self) -> None:
        self.follow()

    def focus_step(self, step: int) -> bool:
        """Focus the message ``step`` away from the focused one (from outside, either way: the
        last, the one nearest the message box). False when that runs past the last message."""
        views = list(self.query(MessageView))
        if not views:
            return False
        focused = self.screen.focused
        if focused in views:
            index = views.index(focused) + step
        else:
            index = len(views) - 1
        if index >= len(views):
            return False
        self.screen.set_focus(views[max(0, index)])  # at once: the next key is the message's
        return True

    def focus_entry(self, entry: Entry) -> None:
        """Focus ``entry``'s message once it is mounted (after a version switch drew it)."""
        view = self._views.get(id(entry))
        if view is not None:
            self.call_after_refresh(view.focus)

    def toggle_thinking(self) -> bool:
        """Open or fold the thinking of the focused reply, else of the last reply on show that
        thought; False when none did."""
        views = [v for v in self.query(MessageView) if v.thought is not None and v.entry.reasoning]
        if not views:
            return False
        focused = self.screen.focused
        view = focused if focused in views else views[-1]
        assert isinstance(view, MessageView) and view.thought is not None
        view.thought.toggle()
        return True

    def action_focus_step(self, step: int) -> None:
        self.focus_step(step)

    def follow(self) -> None:
        """Anchor to the bottom once the content is taller than the view (after the next layout)."""
        self.call_after_refresh(self._check_follow)

    def on_streaming_markdown_flushed(self, message: StreamingMarkdown.Flushed) -> None:
        message.stop()
        if not self.is_anchored:
            self.follow()

    def _check_follow(self) -> None:
        overflowing = self.virtual_size.height > self.scrollable_content_region.height
        if overflowing and not self.is_anchored:
            self.anchor()
        elif not overflowing and self.is_anchored:
            self.anchor(False)

    @property
    def alternatives(self) -> AlternativesView | None:
        found = self.query(AlternativesView)
        return found.first() if found else None

    def add(self, entry: Entry) -> None:
        alternatives = self.alternatives
        view = self._view(entry)
        if alternatives is not None:
            self.mount(view, before=alternatives)
        else:
            self.mount(view)
        self.follow()

    def update(self, entry: Entry, delta: OutputDelta | None = None) -> None:
        """``entry`` changed (``delta``: the text the engine added to it)."""
        view = self._views.get(id(entry))
        if view is not None:  # mounting or not: a view draws from its entry (never drop one)
            view.refresh_entry(delta)
            if not self.is_anchored:
                self.follow()

    def refresh_entries(self) -> None:
        """Redraw every message view (which messages the model sees changed)."""
        for view in self._views.values():
            view.refresh_entry()

    def reset(self) -> None:
        """Drop the message views whose entries are gone; add any that are new; redraw the
        others (their ``◀ 1/2 ▶`` may have changed: an alternative kept, a version deleted)."""
        alive = {id(e) for e in self.session.entries}
        for key, view in list(self._views.items()):
            if key not in alive:
                del self._views[key]
                view.remove()
            else:
                view.refresh_entry()
        for entry in self.session.entries:
            if id(entry) not in self._views:
                self.add(entry)
        self.follow()

    def show_alternatives(self) -> AlternativesView | None:
        """Replace the alternatives panes with the session's current ones (if any)."""
        old = self.alternatives
        if old is not None:
            old.remove()
        generation = self.session.generation
        if not self.session.choosing or generation is None:
            return None
        view = AlternativesView(self.session.id, generation)
        self.mount(view)
        self.follow()
        return view
