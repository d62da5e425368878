"""A chat's messages as a tree of branches, and the path through it that is on show.

Every message follows a parent (None for the first ones). The messages that follow the same
parent are the versions of one turn (a question edited, a reply regenerated, alternatives):
a `Fork`, with one current version. Following the current versions from the top gives the
transcript on show and sent to the model. Nothing is ever dropped by editing or regenerating:
a new version is added and made current, and the user can move back to any other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from chatpage.chat.entry import Entry, Fork


class Transcript:
    """The tree of one chat's messages."""

    def __init__(self) -> None:
        self.top = Fork()

    def path(self, upto: Entry | None = None) -> list[Entry]:
        """The current version at every fork, from the first message down (to `upto`
        itself, included, when given; ValueError if it is not on show)."""
        path = []
        for entry in self._walk():
            path.append(entry)
            if entry is upto:
                return path
        if upto is not None:
            raise ValueError("the message is not on show")
        return path

    def _walk(self) -> Iterator[Entry]:
        entry = self.top.chosen()
        while entry is not None:
            yield entry
            entry = entry.replies.chosen()

    def tip(self) -> Entry | None:
        """The last message on show."""
        last = deque(self._walk(), maxlen=1)
        return last[0] if last else None

    def after(self, parent: Entry | None) -> Fork:
        """The fork of the turn that follows `parent` (None: the first turn)."""
        return self.top if parent is None else parent.replies

    def fork_of(self, entry: Entry) -> Fork:
        """The fork `entry` is a version in."""
        if entry.fork is None:
            raise ValueError("the message is not in this transcript")
        return entry.fork

    def append(self, entry: Entry) -> Entry:
        """Add `entry` after the last message on show."""
        return self.attach(entry, self.tip())

    def attach(self, entry: Entry, parent: Entry | None, current: bool = True) -> Entry:
        """Add `entry` as a new version of the turn after `parent` (None: the first turn);
        `current` makes it the one on show there."""
        fork = self.after(parent)
        entry.parent, entry.fork = parent, fork
        fork.versions.append(entry)
        if current or len(fork.versions) == 1:
            fork.current = len(fork.versions) - 1
        return entry

    def add_version(self, of: Entry, entry: Entry) -> Entry:
        """Add `entry` as a new version of `of`'s turn and show it (a fork at `of`)."""
        return self.attach(entry, of.parent)

    def hide_after(self, parent: Entry | None) -> None:
        """Show no version of the turn after `parent` (alternatives for it are on offer)."""
        self.after(parent).current = -1

    def unhide_after(self, parent: Entry | None) -> None:
        """Undo `hide_after`: the newest version of the turn is on show again."""
        fork = self.after(parent)
        if fork.current < 0:
            fork.current = len(fork.versions) - 1 if fork.versions else 0

    def switch(self, entry: Entry, step: int) -> Entry:
        """Show the version `step` away from `entry` in its fork (clamped to the ends), and
        return it; the forks below it keep their own current versions."""
        fork = self.fork_of(entry)
        index = fork.index(entry) + step
        fork.current = max(0, min(len(fork.versions) - 1, index))
        return fork.versions[fork.current]

    def remove(self, entry: Entry) -> Entry | None:
        """Take `entry` (and everything after it) out of the tree; if it was on show, the
        newest other version of its turn takes its place. Returns the version on show there
        now (None: none is left), what the store then saves as current."""
        fork = self.fork_of(entry)
        index = fork.index(entry)
        was_current = index == fork.current
        del fork.versions[index]
        if was_current:
            fork.current = max(0, len(fork.versions) - 1)
        elif index < fork.current:
            fork.current -= 1
        return fork.chosen()

    def restore(self, entry: Entry, index: int, current: bool) -> None:
        """Put a removed `entry` (with what followed it) back at `index` among the versions
        of its turn; `current`: on show again."""
        fork = self.fork_of(entry)
        fork.versions.insert(index, entry)
        if current:
            fork.current = index
        elif index <= fork.current:
            fork.current += 1

    def clear(self) -> None:
        self.top = Fork()

    def __iter__(self) -> Iterator[Entry]:
        """Every message of every branch, parents before their children."""
        for entry in self.top.versions:
            yield from below(entry)


def below(entry: Entry) -> Iterator[Entry]:
    """`entry` and every message after it on every branch, parents before children."""
    stack = [entry]
    while stack:
        entry = stack.pop()
        yield entry
        stack.extend(reversed(entry.replies.versions))
