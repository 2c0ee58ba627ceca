"""Undo on failure: the one way a request that leaves traces as it goes (an assumption, a reservation, a
lock, an annotation) takes all of them back when any later step fails, whatever the failure is.

    with Transaction() as undo:
        state.assume(...);        undo.add(lambda: state.remove_pod(...))
        quota.reserve(...);       undo.add(lambda: quota.release(...))
        cluster.patch_metadata(...)          # raises: the reservation, then the assumption, are undone

A transaction whose first steps must happen under a lock that its last ones must not hold (the filter
assumes under the state's lock, then writes to the API server without it) runs its first part in
`with undo.part():`, which undoes everything on failure and keeps the steps on success, and its last part in
`with undo:`.

Each undo step runs even when an earlier one fails (that failure is logged); the original exception then
propagates unchanged, so callers translate failures to answers in one place.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Self

__all__ = ["Transaction"]

log = logging.getLogger(__name__)


class Transaction:
    """Undo steps registered as a change is made, run in reverse order if the block raises."""

    def __init__(self) -> None:
        self._undo: list[tuple[str, Callable[[], object]]] = []

    def add(self, undo: Callable[[], object], what: str = "") -> None:
        """Register how to take back the step just done."""
        self._undo.append((what, undo))

    def __enter__(self) -> Self:
        return self

    @contextlib.contextmanager
    def part(self) -> Iterator[Self]:
        """A first part of the transaction: undone (with everything before it) if it raises, kept otherwise."""
        try:
            yield self
        except BaseException as exc:
            self._roll_back(type(exc))
            raise

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self._undo.clear()
            return
        self._roll_back(kind)

    def abandon(self, why: str = "abandoned") -> None:
        """Take every step back now, outside a failing block (a change given up later: a decision whose bind
        failed before it was written)."""
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception:
                log.exception("undoing %s (%s) failed", what or "a step", why)

    def _roll_back(self, kind: type[BaseException]) -> None:
        while self._undo:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception:  # the next undo steps still run; the original error is what the caller sees
                log.exception("undoing %s after %s failed", what or "a step", kind.__name__)
