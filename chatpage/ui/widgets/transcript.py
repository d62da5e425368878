"""TranscriptView: the messages on show of a session's `Transcript`, then its alternatives
while they are on show.

It follows the stream (anchored to the bottom) unless the user scrolls up. The anchor is set only
once the messages overflow the view, so a short chat reads from the top. With the focus in it,
j/k move the focus to the next/previous message.

A long chat opens at once: only its latest messages are mounted (`BATCH`, more until they fill
the view twice over), under a line that counts the earlier ones; scrolling near the top (or
moving the focus past the first message, or a click on that line) mounts the `BATCH` before
them, the messages on show staying where they are.
"""

from __future__ import annotations

from rich.text import Text
from textual import events, on
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.widget import AwaitMount
from textual.widgets import Static

from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.engine.client import OutputDelta
from chatpage.ui.text import clean
from chatpage.ui.widgets.alternatives import AlternativesView
from chatpage.ui.widgets.message import MessageView
from chatpage.ui.widgets.streaming_markdown import StreamingMarkdown

BATCH = 20
"""Messages mounted at a time: the latest when a chat opens, then earlier ones as needed."""


class TranscriptView(VerticalScroll):
    """Message views for the entries on show of a session's `Transcript`."""

    BINDINGS = [
        Binding("j", "focus_step(1)", "Next message", show=False, id="transcript_next"),
        Binding("k", "focus_step(-1)", "Previous message", show=False, id="transcript_prev"),
    ]

    def __init__(self, session: ChatSession, **kwargs) -> None:
        super().__init__(**kwargs)
        self.session = session
        self._views: dict[int, MessageView] = {}  # id(entry) -> view, of those mounted
        self._hidden = 0  # the first entries on show, not mounted (yet)
        self._earlier = Static(classes="earlier")  # counts them
        greeting = session.persona.greeting
        self._greeting = Static(Text(clean(greeting)), classes="greeting") if greeting else None
        self._placing = False  # earlier messages are being mounted

    def _view(self, entry: Entry) -> MessageView:
        speaker = "You" if entry.role == "user" else self.session.persona.name
        view = MessageView(entry, speaker)
        self._views[id(entry)] = view
        return view

    def compose(self):
        entries = self.session.entries
        self._hidden = max(0, len(entries) - BATCH)
        if self._greeting is not None:
            yield self._greeting
        yield self._earlier
        for entry in entries[self._hidden :]:
            yield self._view(entry)
        if self.session.choosing:
            yield AlternativesView(self.session.id, self.session.generation)
        self._count_earlier()

    def on_mount(self) -> None:
        self.follow()

    # -- mounting the earlier messages -----------------------------------------------------------
    @property
    def placing(self) -> bool:
        """Earlier messages are being mounted (the view is put back in place after)."""
        return self._placing

    def _count_earlier(self) -> None:
        """The line above the mounted messages (and the greeting once they all are)."""
        hidden = self._hidden
        self._earlier.display = hidden > 0
        plural = "s" if hidden != 1 else ""
        self._earlier.update(Text(f"▲ {hidden:,} earlier message{plural}: scroll up to see them"))
        if self._greeting is not None:
            self._greeting.display = not hidden

    def show_earlier(self, count: int = BATCH) -> list[MessageView]:
        """Mount the ``count`` messages before the first one mounted (the views, top first); the
        messages on show stay in place (unless the view follows the bottom)."""
        if not self._hidden:
            return []
        start = max(0, self._hidden - count)
        views = [self._view(e) for e in self.session.entries[start : self._hidden]]
        self._hidden = start
        first = next(iter(self.query(MessageView)), None)
        mounted = self.mount_all(views, after=self._earlier)
        if first is not None and self.scroll_y < self.max_scroll_y:  # (not following the end)
            self._placing = True
            self.call_later(
                self._keep_place, mounted, first, first.virtual_region.y - self.scroll_y
            )
        self._count_earlier()
        return views

    async def _keep_place(self, mounted: AwaitMount, first: MessageView, offset: float) -> None:
        """Once ``mounted`` and laid out: scroll so that ``first`` is ``offset`` lines from the
        top again, as before the messages above it were mounted."""
        await mounted
        self.call_after_refresh(self._placed, first, offset)

    def _placed(self, first: MessageView, offset: float) -> None:
        self._placing = False
        self.scroll_to(y=first.virtual_region.y - offset, animate=False, immediate=True)
        self.follow()

    def _fill(self) -> None:
        """Mount earlier messages while the top is less than a screen away (so scrolling up
        always finds some)."""
        height = self.scrollable_content_region.height
        if self._hidden and not self._placing and height and self.scroll_y < height:
            self.show_earlier()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        if self.is_mounted:
            self._fill()

    def watch_virtual_size(self) -> None:
        self._laid_out()

    def on_resize(self) -> None:
        self._laid_out()  # (a layout that only showed it sets its size without the watcher)

    def _laid_out(self) -> None:
        if self._hidden or not self.is_anchored:  # whether to follow, or to fill
            self.follow()

    @on(events.Click, ".earlier")
    def _earlier_clicked(self, event: events.Click) -> None:
        event.stop()
        self.show_earlier()

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
        if index < 0 and self._hidden:  # past the first mounted: the one before it
            self.call_after_refresh(self.screen.set_focus, self.show_earlier()[-1])
            return True
        self.screen.set_focus(views[max(0, index)])  # at once: the next key is the message's
        return True

    def focus_entry(self, entry: Entry) -> None:
        """Focus ``entry``'s message once it is mounted (after a version switch drew it; one
        above those mounted is mounted first)."""
        entries = self.session.entries
        if id(entry) not in self._views and entry in entries[: self._hidden]:
            self.show_earlier(self._hidden - entries.index(entry))
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
        height = self.scrollable_content_region.height
        overflowing = self.virtual_size.height > height
        if overflowing and not self.is_anchored:
            self.anchor()
        elif not overflowing and self.is_anchored:
            self.anchor(False)
        self._fill()

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
        """Drop the message views whose entries are gone; add any that are new, each after
        the one before it (from the first mounted still on show down); redraw the others
        (their ``◀ 1/2 ▶`` may have changed: an alternative kept, a version deleted)."""
        entries = self.session.entries
        index = {id(e): i for i, e in enumerate(entries)}
        for key, view in list(self._views.items()):
            if key not in index:
                del self._views[key]
                view.remove()
            else:
                view.refresh_entry()
        kept = [index[key] for key in self._views]
        self._hidden = min(kept) if kept else max(0, len(entries) - BATCH)
        above: Static | MessageView = self._earlier
        new: list[MessageView] = []
        for entry in entries[self._hidden :]:
            mounted = self._views.get(id(entry))
            if mounted is None:
                new.append(self._view(entry))
                continue
            if new:
                self.mount_all(new, after=above)
                new = []
            above = mounted
        if new:
            self.mount_all(new, after=above)
        self._count_earlier()
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
