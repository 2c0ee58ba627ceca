"""Holds: the room a preemption frees, kept for its preemptor until it is placed or the hold expires.

A hold names the preemptor (namespace, name, UID), the node, the victims evicted for it and the placement the
preemptor would get there once they are gone; it lasts until `until` (seconds since the epoch). While it lasts the
placement is counted in the `ClusterState` as usage of a pod of its own (`hold_key`: the preemptor's key with
`@hold`, which no pod name can carry), so no other pod's filter, smaller or not, takes the room as the victims
leave; the preemptor's own filter sets it aside first (`HoldBook.set_aside`), so that it fits into it.

A hold is written on the preemptor as the annotation `hami.io/preemption-hold` (JSON) before any victim is
evicted, so a restarted scheduler finds it in its first list (`HoldBook.adopt`) and neither loses the room nor
evicts again: a preemptor whose hold lasts is never preempted for twice. A hold read back from a pod is trusted
only as far as it cannot be stretched: its UID must be the pod's, the pod must still wait for a node, and it
lasts no longer than `hold_seconds` from when it is read (a tenant who writes the annotation on its own pod
reserves at most that long, and only devices it could have asked for).

Owns the book of holds and their annotation; choosing victims is `hami.scheduler.preemption`'s, evicting
`hami.scheduler.preempting`'s. Callers hold the state's lock while they change the book.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hami.cluster.port import KubeObject, meta, pod_key
from hami.codec import AnnotationError, decode_pod_devices, encode_pod_devices
from hami.lifecycle import TERMINAL_PHASES
from hami.model import NO_INIT, ContainerPlacement, RunOrder
from hami.scheduler.state import VGPU_NODE_ANNOTATION, ClusterState

__all__ = ["HOLD_ANNOTATION", "Hold", "HoldBook", "hold_key"]

log = logging.getLogger(__name__)

HOLD_ANNOTATION = "hami.io/preemption-hold"
HOLD_SUFFIX = "@hold"


def hold_key(namespace: str, name: str) -> str:
    """The state's key of the usage a hold counts (never a pod's: `@` is not allowed in a pod name)."""
    return pod_key(namespace, name + HOLD_SUFFIX)


@dataclass(frozen=True)
class Hold:
    namespace: str
    name: str
    uid: str
    node: str
    priority: int
    until: float
    victims: tuple[tuple[str, str], ...]
    """(namespace/name, UID) of each pod evicted for the preemptor."""
    allocation: Mapping[str, tuple[ContainerPlacement, ...]]
    order: RunOrder = NO_INIT
    """The preemptor's run order (`hami.model.RunOrder`): its hold counts as the pod will."""

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)

    def annotation(self) -> str:
        return json.dumps(
            {
                "uid": self.uid,
                "node": self.node,
                "until": round(self.until, 3),
                "victims": [{"pod": k, "uid": u} for k, u in self.victims],
                "allocation": {kind: encode_pod_devices(p) for kind, p in self.allocation.items()},
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_pod(cls, pod: KubeObject, limit: float, now: float) -> Hold | None:
        """The hold written on `pod`, if it still holds (see the module's trust rules); None otherwise."""
        m, spec = meta(pod), pod.get("spec") or {}
        value = (m.get("annotations") or {}).get(HOLD_ANNOTATION)
        if not value or spec.get("nodeName") or (m.get("annotations") or {}).get(VGPU_NODE_ANNOTATION):
            return None
        if str((pod.get("status") or {}).get("phase") or "") in TERMINAL_PHASES or m.get("deletionTimestamp"):
            return None
        where = f"pod {m.get('namespace')}/{m.get('name')}: {HOLD_ANNOTATION}"
        try:
            data = json.loads(value)
            if not isinstance(data, dict) or data.get("uid") != m.get("uid"):
                return None
            until = min(float(data["until"]), now + limit)
            allocation = {str(k): decode_pod_devices(str(v), HOLD_ANNOTATION) for k, v in data["allocation"].items()}
            victims = tuple((str(v["pod"]), str(v.get("uid") or "")) for v in data.get("victims") or ())
            node = str(data["node"])
        except (ValueError, KeyError, TypeError, AttributeError, AnnotationError) as exc:
            log.warning("%s is not a hold this scheduler wrote (%s); ignoring it", where, exc)
            return None
        if until <= now:
            return None
        priority = spec.get("priority")
        return cls(
            namespace=str(m.get("namespace") or "default"),
            name=str(m.get("name")),
            uid=str(m.get("uid") or ""),
            node=node,
            priority=priority if isinstance(priority, int) and not isinstance(priority, bool) else 0,
            until=until,
            victims=victims,
            allocation=allocation,
            order=RunOrder.of_spec(spec),
        )


class HoldBook:
    """The holds in force, each counted in the state as its own usage."""

    def __init__(self, state: ClusterState, hold_seconds: float) -> None:
        self.state = state
        self.hold_seconds = hold_seconds
        self.holds: dict[str, Hold] = {}
        """Preemptor's pod key → its hold."""

    def keys(self) -> frozenset[str]:
        """The state's keys of every hold's usage (never victims)."""
        return frozenset(hold_key(h.namespace, h.name) for h in self.holds.values())

    def put(self, hold: Hold) -> None:
        """Count `hold` (replacing the preemptor's earlier one)."""
        with self.state.lock:
            self.drop(hold.namespace, hold.name)
            self.holds[hold.key] = hold
            self._count(hold)

    def _count(self, hold: Hold) -> None:
        self.state.assume(
            hold.namespace, hold.name + HOLD_SUFFIX, hold.uid, hold.node, hold.order, hold.allocation,
            priority=hold.priority,
        )  # fmt: skip
        record = self.state.nodes.get(hold.node)
        if record is not None:  # a hold awaits no Allocate: binds to the node need not wait for it
            record.in_flight.discard(hold_key(hold.namespace, hold.name))

    def get(self, namespace: str, name: str, now: float | None = None) -> Hold | None:
        """The preemptor's hold while it lasts (an expired one is dropped)."""
        hold = self.holds.get(pod_key(namespace, name))
        if hold is not None and hold.until <= (time.time() if now is None else now):
            self.drop(namespace, name)
            return None
        return hold

    def drop(self, namespace: str, name: str) -> Hold | None:
        """Forget the preemptor's hold and the usage it counts."""
        with self.state.lock:
            hold = self.holds.pop(pod_key(namespace, name), None)
            if hold is not None:
                self.state.remove_pod(namespace, name + HOLD_SUFFIX)
            return hold

    def set_aside(self, namespace: str, name: str) -> Hold | None:
        """Stop counting the preemptor's hold while its own filter fits it (`restore` counts it again)."""
        hold = self.get(namespace, name)
        if hold is not None:
            self.state.remove_pod(namespace, name + HOLD_SUFFIX)
        return hold

    def restore(self, hold: Hold) -> None:
        if self.holds.get(hold.key) is hold:
            self._count(hold)

    def expire(self, now: float | None = None) -> list[Hold]:
        """Drop every hold past its time; returns them."""
        now = time.time() if now is None else now
        gone = [h for h in self.holds.values() if h.until <= now]
        for hold in gone:
            self.drop(hold.namespace, hold.name)
        return gone

    def adopt(self, pods: Iterable[KubeObject], now: float | None = None) -> int:
        """Count the holds written on `pods` (a restarted scheduler's first list); returns how many."""
        now = time.time() if now is None else now
        adopted = 0
        for pod in pods:
            hold = Hold.from_pod(pod, self.hold_seconds, now)
            if hold is not None:
                self.put(hold)
                adopted += 1
        return adopted

    def pod_changed(self, pod: KubeObject, deleted: bool) -> None:
        """A preemptor deleted, bound or placed no longer needs its hold."""
        m = meta(pod)
        namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
        hold = self.holds.get(pod_key(namespace, name))
        if hold is None:
            return
        annotations = m.get("annotations") or {}
        placed = (pod.get("spec") or {}).get("nodeName") or annotations.get(VGPU_NODE_ANNOTATION)
        if deleted or placed or str(m.get("uid") or "") != hold.uid:
            self.drop(namespace, name)
