"""Filters first: the watch handlers' work steps aside while a filter decides.

A filter holds the interpreter lock for a few milliseconds, and everything else the scheduler does (applying watch
events, verifying placements, counting quotas) competes with it for that lock: each event handled while a filter
runs lengthens it by the event's own cost, and against a real API server the events of the pods just bound arrive
exactly while the next ones are filtered. kube-scheduler waits on the filter; nothing waits on an event applied a
few milliseconds later (the state it feeds is read by the next decision, and an event that arrives during a filter
could as well have arrived after it). So the service's watch handlers wait, at most `YIELD_SECONDS`, while a
decision is in progress, and go on as soon as none is.

Two bounds keep the watches from falling behind. A waiting handler goes on once no decision is in progress (even
if the next begins before it runs), or after `YIELD_SECONDS`. And a thread that waited does not wait again for the next
`YIELD_SECONDS`: with filters back to back (a saturated scheduler, or several filtering at once) the watch would
otherwise apply one event per filter, and fall further behind with every pod.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

__all__ = ["Precedence", "YIELD_SECONDS"]

YIELD_SECONDS = 0.02
"""The longest a watch handler waits for a decision to end (several times a filter's p99 at 5,000 nodes), and how
long after a wait its thread goes on without waiting."""


class Precedence:
    """Counts the decisions in progress (`with precedence:`); `yield_to_decisions` waits while there are any."""

    def __init__(self) -> None:
        self._deciders: dict[int, int] = {}
        """Thread → its decisions in progress (none: no entry). A handler called on a deciding thread (a synchronous
        backend) does not wait for itself."""
        self._waited: dict[int, float] = {}
        """Thread → when its last wait ended (`time.monotonic`)."""
        self._ended = threading.Condition(threading.Lock())

    def __enter__(self) -> None:
        thread = threading.get_ident()
        with self._ended:
            self._deciders[thread] = self._deciders.get(thread, 0) + 1

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        thread = threading.get_ident()
        with self._ended:
            if self._deciders[thread] > 1:
                self._deciders[thread] -= 1
            else:
                del self._deciders[thread]
            if not self._deciders:
                self._ended.notify_all()

    @property
    def deciding(self) -> bool:
        """Whether a decision is in progress."""
        return bool(self._deciders)

    def yield_to_decisions(self, longest: float | None = None) -> bool:
        """Wait until no decision is in progress, or `longest` seconds pass (default `YIELD_SECONDS`); True when it
        waited. Called on a thread that is deciding, or within `YIELD_SECONDS` of its last wait, it returns at once."""
        if not self._deciders:  # the usual case, without the lock
            return False
        thread = threading.get_ident()
        with self._ended:
            if not self._deciders or thread in self._deciders:
                return False
            last = self._waited.get(thread)
            if last is not None and time.monotonic() - last < YIELD_SECONDS:
                return False  # it waited a moment ago: catch up first
            self._ended.wait(YIELD_SECONDS if longest is None else longest)
            self._waited[thread] = time.monotonic()
            return True
