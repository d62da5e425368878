"""What a session tells its observers: one frozen dataclass per kind of change.

Everything that changes a `ChatSession` calls `ChatSession.changed` with one of these, and
every observer (the session's views, the recorder) dispatches on it with `match`.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatpage.chat.entry import Entry, ToolRun
from chatpage.engine.outputs import OutputDelta


@dataclass(frozen=True)
class EntryAdded:
    """`entry` was added to the tree (and is on show, if it is the current version)."""

    entry: Entry


@dataclass(frozen=True)
class EntryUpdated:
    """`entry`'s text, status or stats changed; from the engine, `delta` is the text it brought,
    appended to what is shown (a /continue'd reply too), or replacing it (``rewrite``)."""

    entry: Entry
    delta: OutputDelta | None = None


@dataclass(frozen=True)
class EntryRemoved:
    """`entry` and what followed it left the tree; `shown` is the version its turn shows now,
    as the tree decided (None: no version is left)."""

    entry: Entry
    shown: Entry | None


@dataclass(frozen=True)
class PathChanged:
    """The path on show changed (a fork switched, alternatives offered or put away): redraw it."""


@dataclass(frozen=True)
class EntriesRestored:
    """A deleted `entry` and what followed it came back to the tree, where they were (undo)."""

    entry: Entry


@dataclass(frozen=True)
class Cleared:
    """Every message left the chat (/clear)."""


@dataclass(frozen=True)
class ContextChanged:
    """What the next turn sends changed: the meter, the dropped (greyed) turns."""


@dataclass(frozen=True)
class GenerationChanged:
    """Alternatives started, were kept or were dropped."""


@dataclass(frozen=True)
class CandidateUpdated:
    """Alternative `index` of the generation changed (`delta`: as for `EntryUpdated`)."""

    index: int
    delta: OutputDelta | None = None


@dataclass(frozen=True)
class SettingsChanged:
    """The sampling settings, the next-reply mode or the system prompt changed."""


@dataclass(frozen=True)
class TitleChanged:
    """The chat was renamed."""


@dataclass(frozen=True)
class AttachmentsChanged:
    """The files attached to the next message changed."""


@dataclass(frozen=True)
class BusyChanged:
    """Streaming started or ended."""


@dataclass(frozen=True)
class Closed:
    """The session was closed (its generation stopped); it is no longer open."""


@dataclass(frozen=True)
class ToolAsked:
    """The model wants `run` (a call in `entry`'s latest tool step) run: ask the user
    (`Chats.answer_tool`)."""

    entry: Entry
    run: ToolRun


Change = (
    EntryAdded
    | EntryUpdated
    | EntryRemoved
    | EntriesRestored
    | PathChanged
    | Cleared
    | ContextChanged
    | GenerationChanged
    | CandidateUpdated
    | SettingsChanged
    | TitleChanged
    | AttachmentsChanged
    | BusyChanged
    | Closed
    | ToolAsked
)
"""Every kind of change a session tells its observers about."""
