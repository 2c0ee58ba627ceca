"""Decisions awaiting their bind, and the pods the watch has delivered (`ExtenderSettings.record_at_bind`).

With `record_at_bind` a filter's decision is counted in the state at once but written to the pod only by its bind
(`hami.scheduler.binding`), so until then it lives here: the bind takes it, a new filter of the same pod or the
pod's deletion drops it. A decision is kept only for a pod that exists: the service reports every live pod the
watch delivers (`pod_seen`) and how far the watch has read (`pods_watched_to`), and a filter body naming a pod the
watch has not delivered, once the watch has passed the body's resourceVersion, is refused (`exists`), so a body
naming a pod that does not exist leaves nothing behind.

Owns no API call and no usage: it holds what the filter decided and what the watch said, nothing else.
Thread-safety: a lock for the decisions and a condition for the pods seen; a filter waits on the condition
(briefly, `WATCH_LAG_SECONDS`) for a watch that lags behind the body it was sent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from hami.cluster.port import pod_key, revision
from hami.model import Pod
from hami.scheduler.state import Decision
from hami.transaction import Transaction

__all__ = ["WATCH_LAG_SECONDS", "PendingDecision", "PendingDecisions"]

WATCH_LAG_SECONDS = 2.0
"""How long a filter waits for the watch to deliver a pod it has not seen yet (`record_at_bind`)."""


@dataclass(frozen=True)
class PendingDecision:
    """A filter's decision not yet written: what its bind writes, and how to take it back."""

    decision: Decision
    undo: Transaction
    """Takes back the assumption, the host usage and the quota reservation."""


class PendingDecisions:
    """pod key → its decision, from the filter until its bind; and the pods the watch delivered."""

    def __init__(self) -> None:
        self._decisions: dict[str, PendingDecision] = {}
        self._decisions_lock = threading.Lock()
        self._pods_seen: dict[str, str] = {}
        """pod key → UID of every live pod the service's watch delivered."""
        self._pods_seen_changed = threading.Condition()
        self._pods_version = 0
        """The newest resourceVersion the pod watch delivered."""

    def put(self, pending: PendingDecision) -> None:
        """Keep the decision until its bind takes it."""
        pod = pending.decision.pod
        with self._decisions_lock:
            self._decisions[pod_key(pod.namespace, pod.name)] = pending

    def take(self, namespace: str, name: str) -> PendingDecision | None:
        """The pod's decision not yet written, no longer kept here (None when there is none)."""
        with self._decisions_lock:
            return self._decisions.pop(pod_key(namespace, name), None)

    def forget(self, namespace: str, name: str, version: object = None) -> None:
        """The pod is gone (its deletion at `version`): drop its decision not yet written (called by the
        service on pod deletion)."""
        with self._decisions_lock:
            self._decisions.pop(pod_key(namespace, name), None)
        with self._pods_seen_changed:
            self._pods_seen.pop(pod_key(namespace, name), None)
        self.pods_watched_to(version)

    def pods_watched_to(self, version: object) -> None:
        """The pod watch has delivered everything up to `version` (a list's, or an event's)."""
        number = revision(version) or 0
        with self._pods_seen_changed:
            if number > self._pods_version:
                self._pods_version = number
                self._pods_seen_changed.notify_all()

    def pod_seen(self, namespace: str, name: str, uid: str, version: object) -> None:
        """The watch delivered the pod at `version` (called by the service for every live pod)."""
        with self._pods_seen_changed:
            self._pods_seen[pod_key(namespace, name)] = uid
        self.pods_watched_to(version)

    def seen(self, namespace: str, name: str, uid: str) -> bool:
        """The watch has delivered the pod with this UID (without waiting for it)."""
        with self._pods_seen_changed:
            return self._pods_seen.get(pod_key(namespace, name)) == uid

    def exists(self, pod: Pod, version: object) -> bool:
        """The pod of a filter body is one the watch delivered. A watch behind the body's resourceVersion is waited
        for (briefly); a pod the watch has passed without delivering, or a body without a resourceVersion, does not
        exist here."""
        key = pod_key(pod.namespace, pod.name)
        wanted = revision(version)
        if wanted is None or not pod.uid:
            return False
        with self._pods_seen_changed:
            self._pods_seen_changed.wait_for(
                lambda: self._pods_seen.get(key) == pod.uid or self._pods_version >= wanted,
                timeout=WATCH_LAG_SECONDS,
            )
            return self._pods_seen.get(key) == pod.uid
