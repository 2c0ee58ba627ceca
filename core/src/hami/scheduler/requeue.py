"""Asking kube-scheduler to retry a pod refused in the instant before capacity freed.

kube-scheduler puts a pod the extender refused among its unschedulable pods and retries it on the next cluster
event (an extender's rejection registers for every event), so a pod refused *before* a deletion freed its card
is retried when kube-scheduler sees that deletion. One case slips through: kube-scheduler sees the freeing event
first, pops the pod, and asks this scheduler, whose watch has not applied the event yet; the filter refuses from
the older view, and kube-scheduler, having seen the event before the attempt, waits for another one. In a quiet
cluster that is its five-minute flush of unschedulable pods.

`Requeuer` closes that gap. The extender tells it of each refusal for capacity, with the count of capacity frees
(`ClusterState.frees`) its view held; the service tells it when its watch has applied a free. A pod refused from
a view without that free, less than `window` seconds before it was applied, is nudged: one metadata patch of
`REQUEUE_ANNOTATION`, which kube-scheduler sees as an update of the unschedulable pod and retries it. Each
refusal is nudged at most once, the newest first, and at most `rate` nudges a second leave (a burst of frees
in a crowded cluster writes a bounded number of patches). Writes leave from one thread of their own, never from
a watch or filter thread, and only from the leader.

The annotation is this project's, not HAMi's: it carries the time of the free and grants nothing, so a tenant
writing it on its own pod only asks for a retry kube-scheduler would make anyway.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from hami.cluster.port import Cluster, ClusterError, NotFoundError, pod_key

__all__ = ["REQUEUE_ANNOTATION", "Requeuer"]

log = logging.getLogger(__name__)

REQUEUE_ANNOTATION = "hami.io/requeued-at"
"""Written on a pending pod refused from a view that missed a capacity free: when that free was applied."""


@dataclass(frozen=True)
class _Refusal:
    namespace: str
    name: str
    frees: int
    """The state's count of capacity frees the refusing filter's view held."""
    at: float
    """When the refusing filter started (monotonic)."""


class Requeuer:
    """Remembers recent refusals for capacity and nudges those a capacity free came too late for."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        window: float = 2.0,
        rate: float = 20.0,
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.window = window
        """How long before a free was applied a refusal may have come from a view without it and still be
        nudged: the lag between kube-scheduler's informer and this scheduler's watch, with room to spare (a
        pod refused earlier is retried by kube-scheduler itself, which sees the free after the attempt)."""
        self.rate = rate
        self.is_leader = is_leader
        self.clock = clock
        self._lock = threading.Lock()
        self._refused: dict[str, _Refusal] = {}
        self._applied = 0
        """The newest count of capacity frees the service's watch has applied (`capacity_freed`)."""
        self._tokens = rate
        self._filled = clock()
        self._writer: ThreadPoolExecutor | None = None
        self.on_nudge: Callable[[], None] = lambda: None
        """Called after each nudge written (the service counts it in `hami_scheduler_requeues_total`)."""

    def refused(self, namespace: str, name: str, frees: int, started: float) -> None:
        """A filter that started at `started` (monotonic) and read a state with `frees` capacity frees refused
        the pod for capacity."""
        refusal = _Refusal(namespace, name, frees, started)
        with self._lock:
            if self._applied > frees:  # a free was applied while the filter decided: its view missed it
                self._nudge([refusal])
            else:
                self._refused[pod_key(namespace, name)] = refusal
                self._prune()

    def placed(self, namespace: str, name: str) -> None:
        """The pod was placed or is gone: no refusal of it is outstanding."""
        with self._lock:
            self._refused.pop(pod_key(namespace, name), None)

    def capacity_freed(self, frees: int) -> None:
        """The service's watch applied capacity frees up to `frees` (`ClusterState.frees`)."""
        with self._lock:
            if frees <= self._applied:
                return
            self._applied = frees
            self._prune()
            missed = [r for r in self._refused.values() if r.frees < frees]
            for refusal in missed:
                del self._refused[pod_key(refusal.namespace, refusal.name)]
            if missed:
                missed.sort(key=lambda r: r.at, reverse=True)
                self._nudge(missed)

    def stop(self) -> None:
        """Wait for the nudges queued (a later nudge starts a new writer thread)."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)

    def _prune(self) -> None:
        oldest = self.clock() - self.window
        for key in [k for k, r in self._refused.items() if r.at < oldest]:
            del self._refused[key]

    def _nudge(self, refusals: list[_Refusal]) -> None:
        """Queue a nudge for each refusal within the window that the rate allows (newest first); under `_lock`."""
        now = self.clock()
        self._tokens = min(self.rate, self._tokens + (now - self._filled) * self.rate)
        self._filled = now
        for refusal in refusals:
            if refusal.at < now - self.window:
                continue
            if self._tokens < 1:
                log.info("requeue: rate of %g nudges/s reached; %s/%s waits for the next event",
                         self.rate, refusal.namespace, refusal.name)  # fmt: skip
                continue
            self._tokens -= 1
            if self._writer is None:
                self._writer = ThreadPoolExecutor(1, thread_name_prefix="requeue")
            self._writer.submit(self._write, refusal, datetime.now(UTC).isoformat(timespec="milliseconds"))

    def _write(self, refusal: _Refusal, stamp: str) -> None:
        if not self.is_leader():
            return
        try:
            self.cluster.patch_metadata(
                "pods", refusal.name, refusal.namespace, annotations={REQUEUE_ANNOTATION: stamp}
            )
        except NotFoundError:
            return
        except ClusterError as exc:
            log.warning("could not ask kube-scheduler to retry %s/%s: %s", refusal.namespace, refusal.name, exc)
            return
        self.on_nudge()
        log.info("asked kube-scheduler to retry %s/%s: refused just before capacity freed",
                 refusal.namespace, refusal.name)  # fmt: skip
