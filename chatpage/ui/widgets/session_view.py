"""SessionView: one session's header and transcript, kept in step with its `ChatSession`."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from chatpage.chat.session import Change, ChatSession
from chatpage.ui.widgets.session_header import SessionHeader
from chatpage.ui.widgets.transcript import Transcript


class SessionView(Vertical):
    """Observes its session and applies each change to the widgets (its parts exist from the
    start, so `transcript` can be asked before the view is mounted)."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__(id=f"session-{session.id}", classes="session-view")
        self.session = session
        self.header = SessionHeader(session, classes="session-header")
        self.transcript = Transcript(session, classes="transcript")

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
        kind = change.kind
        if kind == "entry_added" and change.entry is not None:
            if change.entry is session.transcript.tip():  # else a version not on show
                transcript.add(change.entry)
        elif kind == "entry_updated" and change.entry is not None:
            transcript.update(change.entry, change.delta)
        elif kind in ("entries_reset", "entry_removed", "cleared"):
            transcript.reset()
        elif kind == "context":
            transcript.refresh_entries()
        elif kind == "generation":
            panes = transcript.show_alternatives()
            if panes is not None and self.display:
                panes.focus()
        elif kind == "candidate_updated" and change.index is not None:
            alternatives = transcript.alternatives
            if alternatives is not None:
                alternatives.refresh_candidate(change.index, change.delta)
        if kind in ("settings", "busy", "entry_added", "entries_reset", "entry_removed",
                    "cleared", "generation", "context") or (
                kind == "entry_updated" and change.entry is not None
                and change.entry.status != "streaming"):
            self.header.refresh_session()
