"""SessionView: one session's header and transcript, kept in step with its `ChatSession`."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from chatpage.chat.changes import (
    AttachmentsChanged,
    CandidateUpdated,
    Change,
    Cleared,
    Closed,
    ContextChanged,
    EntriesRestored,
    EntryAdded,
    EntryRemoved,
    EntryUpdated,
    GenerationChanged,
    PathChanged,
    TitleChanged,
)
from chatpage.chat.entry import EntryStatus
from chatpage.chat.session import ChatSession
from chatpage.ui.widgets.session_header import SessionHeader
from chatpage.ui.widgets.transcript import TranscriptView


class SessionView(Vertical):
    """Observes its session and applies each change to the widgets (its parts exist from the
    start, so `transcript` can be asked before the view is mounted)."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__(id=f"session-{session.id}", classes="session-view")
        self.session = session
        self.header = SessionHeader(session, classes="session-header")
        self.transcript = TranscriptView(session, classes="transcript")

    def compose(self) -> ComposeResult:
        yield self.header
        yield self.transcript

    def on_mount(self) -> None:
        self.session.observers.append(self._changed)

    def on_unmount(self) -> None:
        if self._changed in self.session.observers:
            self.session.observers.remove(self._changed)

    def _changed(self, session: ChatSession, change: Change) -> None:
        transcript = self.transcript
        match change:
            case EntryAdded(entry):
                if entry is session.transcript.tip():  # else a version not on show
                    transcript.add(entry)
            case EntryUpdated(entry, delta):
                transcript.update(entry, delta)
            case PathChanged() | EntryRemoved() | EntriesRestored() | Cleared():
                transcript.reset()
            case ContextChanged():
                transcript.refresh_entries()
            case GenerationChanged():
                panes = transcript.show_alternatives()
                if panes is not None and self.display:
                    panes.focus()
            case CandidateUpdated(index, delta):
                alternatives = transcript.alternatives
                if alternatives is not None:
                    alternatives.refresh_candidate(index, delta)
        match change:
            case CandidateUpdated() | TitleChanged() | AttachmentsChanged() | Closed():
                pass  # nothing the header shows
            case EntryUpdated(entry) if entry.status == EntryStatus.STREAMING:
                self.header.request_redraw(final=False)  # the context meter, throttled
            case _:
                self.header.refresh_session()
