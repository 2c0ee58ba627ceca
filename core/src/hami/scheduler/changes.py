"""The change log: which nodes changed in a way a filter's evaluation of them may have, in order.

`ClusterState` appends a node's name each time its devices, their usage, or its CPU and memory change (or it is
added or removed); a reader that kept something per node (`hami.scheduler.ranking`'s rankings and node classes)
remembers the position it is current to and re-reads only the nodes changed since. The log is bounded: past
`CHANGE_LOG_LENGTH` entries its older half is dropped, and a reader older than what is left rebuilds from every
node (`since` answers None). Positions grow for the life of the process, across drops and restarts.

Owns the order of changes only, not what changed. Thread-safety: none of its own; the state's lock guards it.
"""

from __future__ import annotations

__all__ = ["CHANGE_LOG_LENGTH", "ChangeLog"]

CHANGE_LOG_LENGTH = 1 << 16
"""Entries kept in the change log before its older half is dropped (a ranking older than that is rebuilt)."""


class ChangeLog:
    """Node names in the order they changed, addressed by position."""

    def __init__(self) -> None:
        self.entries: list[str] = []
        """A node's name each time it changed, oldest first."""
        self.dropped = 0
        """How many entries were dropped from the front (position p is `entries[p - dropped]`)."""

    def append(self, name: str) -> None:
        """The node changed."""
        self.entries.append(name)
        if len(self.entries) > CHANGE_LOG_LENGTH:
            half = len(self.entries) // 2
            del self.entries[:half]
            self.dropped += half

    @property
    def position(self) -> int:
        """The position after the newest entry."""
        return self.dropped + len(self.entries)

    def since(self, position: int) -> set[str] | None:
        """The nodes changed since `position`; None when that part of the log was dropped."""
        if position < self.dropped:
            return None
        return set(self.entries[position - self.dropped :])

    def restart(self) -> None:
        """Drop every entry and every position handed out so far: every reader rebuilds (the state was rebuilt).

        The next position is past every one handed out (`position` itself included), read before the entries are
        cleared: after them, `position` is only `dropped`, and a reader current to a later position would find
        the log "unchanged since" and keep what it read of the nodes before the rebuild."""
        self.dropped = self.position + 1
        self.entries.clear()
