"""Where the dashboard's figures come from: the cluster, read at most once a second, and a ring buffer of history.

Owns reading Node, Pod and Event objects (and the nodes' lock Leases) through the `Cluster` port (the scheduler's
own client in `hami scheduler`, a kubeconfig's in `hami dashboard`), keeping the last good `Snapshot` when the API
server stops answering, refuses or hangs (with the error and when it was last read, for the page to say so; a read
is waited for `answer_seconds` at most, on a thread of its own, so a hung API server never hangs a page), and
sampling the cluster's totals into a bounded in-process `History` (by default every 30 s for 6 h), by a background
thread while the dashboard runs and on each fresh read. It never writes to the cluster.

Hosted in `hami scheduler`, a `sampler` gives the totals from the scheduler's watched state: the cluster is then
read only for pages (not at start-up, not every 30 s: at 1,000 nodes and 8,000 pods each read is about a second of
CPU and a snapshot of about 190 MiB, beside filters), and a snapshot no page asked for in `keep_seconds` is let go.

A read holds Python's cycle collector off while it lists and builds the snapshot (`_CyclesUnchecked`): the read
allocates about a million short-lived objects, none in a cycle, and the collector's full passes over the whole heap
that so many allocations set off were half of a cold read's time at 1,000 nodes (`benchmarks/dashboard.py`).
Reference counting still frees what the read drops; the collector runs again once the read is over.
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami.cluster.port import Cluster, KubeObject
from hami.dashboard.views import Snapshot, pending_pods, take_snapshot
from hami.status import lock_leases

__all__ = ["DashboardSource", "History", "Reading", "Sample"]

log = logging.getLogger(__name__)


class _CyclesUnchecked:
    """Holds Python's cycle collector off for the length of a `with`: re-entrant, from any thread (the collector is
    one per process: it runs again when the last holder leaves, and only if it was running when the first came)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._lock:
            if self._holders == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0 and self._was_enabled:
                    gc.enable()


_CYCLES_UNCHECKED = _CyclesUnchecked()


@dataclass(frozen=True)
class Sample:
    """The cluster's totals at one moment."""

    at: float
    memory_used: int
    memory_total: int
    cores_used: int
    cores_total: int
    pods: int
    pending: int


class History:
    """The last `capacity` samples, at least `interval` seconds apart (a bounded deque: old ones fall off)."""

    def __init__(self, *, interval: float = 30.0, capacity: int = 720) -> None:
        self.interval = interval
        self._samples: deque[Sample] = deque(maxlen=capacity)
        self._lock = threading.Lock()

    def add(self, snapshot: Snapshot) -> bool:
        """Record the snapshot's totals unless the last sample is younger than `interval`; True when recorded."""
        devices = [d for n in snapshot.status.nodes for d in n.devices]
        return self.add_sample(
            Sample(
                at=snapshot.taken.timestamp(),
                memory_used=sum(d.memory_used for d in devices),
                memory_total=sum(d.memory_total for d in devices),
                cores_used=sum(d.cores_used for d in devices),
                cores_total=sum(d.cores_total for d in devices),
                pods=snapshot.status.pods,
                pending=len(pending_pods(snapshot)),
            )
        )

    def add_sample(self, sample: Sample) -> bool:
        """Record `sample` unless the last one is younger than `interval`; True when recorded."""
        with self._lock:
            if self._samples and sample.at - self._samples[-1].at < self.interval:
                return False
            self._samples.append(sample)
            return True

    def samples(self) -> list[Sample]:
        with self._lock:
            return list(self._samples)


@dataclass(frozen=True)
class Reading:
    """What a page is built from: the newest snapshot (None before the first good read) and, when the last
    read failed, why and since when the figures are stale."""

    snapshot: Snapshot | None
    error: str = ""


def _describe(exc: BaseException) -> str:
    """The error's first line without the transport's long parenthesised internals (a connection pool's repr)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kept, depth, start = [], 0, 0
    for n, char in enumerate(text):
        if char == "(":
            if depth == 0:
                kept.append(text[start:n])
                start = n
            depth += 1
        elif char == ")" and depth:
            depth -= 1
            if depth == 0:
                inner = text[start : n + 1]
                kept.append(inner if len(inner) <= 80 else "")
                start = n + 1
    kept.append(text[start:])
    short = re.sub(r"\s+([;,.])", r"\1", " ".join("".join(kept).split()))
    return short if len(short) <= 400 else short[:399] + "…"


class DashboardSource:
    """Snapshots of `cluster`, cached for `max_age` seconds, accounted with the vendors of `host`."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: Any,
        *,
        max_age: float = 1.0,
        answer_seconds: float = 5.0,
        history: History | None = None,
        clock: Callable[[], float] = time.monotonic,
        sampler: Callable[[], Sample] | None = None,
        keep_seconds: float = 300.0,
    ) -> None:
        self.cluster = cluster
        self.sampler = sampler
        """The cluster's totals without reading it (the scheduler's state, when hosted); None: from snapshots."""
        self.keep_seconds = keep_seconds
        """With a `sampler`: how long a snapshot is kept after the last page read it."""
        self._viewed_at = -float("inf")
        self.plugins = plugins
        self.max_age = max_age
        self.answer_seconds = answer_seconds
        self.history = history or History()
        self._clock = clock
        self._lock = threading.Lock()
        self._last: Snapshot | None = None
        self._read_at = -float("inf")
        self._error = ""
        self._pending: threading.Thread | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._also_stop: list[Callable[[], None]] = []

    def _list(self, resource: Any) -> list[KubeObject]:
        items, _ = self.cluster.list(resource)
        return items

    def read(self) -> Reading:
        """The newest snapshot, re-read when older than `max_age`. The read runs on its own thread and is waited
        for `answer_seconds` at most: a failed or hung read gives the previous snapshot and why."""
        with self._lock:
            self._viewed_at = self._clock()
            fresh = self._clock() - self._read_at < self.max_age
            if self._pending is None and fresh:
                return Reading(self._last, self._error)
            if self._pending is None:  # else a read is under way (another page, the sampler): wait for it too
                self._read_at = self._clock()
                self._pending = threading.Thread(target=self._refresh, name="dashboard-read", daemon=True)
                self._pending.start()
            pending = self._pending
        pending.join(self.answer_seconds)
        with self._lock:
            if pending.is_alive():
                return Reading(self._last, f"the Kubernetes API server did not answer within {self.answer_seconds:g} s")
            return Reading(self._last, self._error)

    def _refresh(self) -> None:
        snapshot, error = None, ""
        try:
            with _CYCLES_UNCHECKED.held():
                nodes, pods = self._list("nodes"), self._list("pods")
                try:
                    events = self._list("events")
                except Exception as exc:  # events are a nicety: a cluster that refuses them still has a dashboard
                    log.debug("events not listed: %s", exc)
                    events = []
                leases = lock_leases(self.cluster, nodes)  # the few nodes' lock Leases (hami.cluster.nodelease)
                snapshot = take_snapshot(nodes, pods, events, self.plugins, now=datetime.now(UTC), leases=leases)
        except Exception as exc:  # an API server that stops answering, refuses, or sends garbage
            error = f"the Kubernetes API server did not answer: {_describe(exc)}"
            log.warning("dashboard: %s", error)
        with self._lock:
            if snapshot is not None:
                self._last = snapshot
            self._error = error
            self._pending = None
        if snapshot is not None and self.sampler is None:
            self.history.add(snapshot)

    def sample(self) -> None:
        """One history sample: from the `sampler` (letting go of a snapshot no page read lately), or a read."""
        if self.sampler is None:
            self.read()
            return
        try:
            self.history.add_sample(self.sampler())
        except Exception:  # a sampler that fails skips one sample, the dashboard goes on
            log.exception("dashboard: the history sample failed")
        with self._lock:
            if self._pending is None and self._clock() - self._viewed_at > self.keep_seconds:
                self._last, self._read_at = None, -float("inf")

    def start(self) -> DashboardSource:
        """Sample the cluster into the history every `history.interval` seconds until `stop()`."""

        def loop() -> None:
            while not self._stop.is_set():
                self.sample()
                self._stop.wait(self.history.interval)

        self._thread = threading.Thread(target=loop, name="dashboard-history", daemon=True)
        self._thread.start()
        return self

    def also_stop(self, stop: Callable[[], None]) -> None:
        """Call `stop` when the source stops (a usage collector started beside it)."""
        self._also_stop.append(stop)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for stop in self._also_stop:
            stop()
