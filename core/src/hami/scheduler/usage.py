"""Pod usage: what a pod uses of its node's devices, read from its annotations (`PodUsage.record_of`), and with
placement keys only as the scheduler signed it.

A pod uses what its `…-allocated` annotations say, on the node named by `spec.nodeName` or, before binding, by
`hami.io/vgpu-node`, until it succeeds or fails (protocol.md section 3). With placement keys (`signer`,
`hami.signing`), its usage is read from what the scheduler signed, not from annotations its owner may have
rewritten: a signature that verifies gives the signed values; one that no longer verifies (or is gone) keeps the
usage already counted for the same pod UID, if it was the scheduler's own decision; only a pod never seen signed
is counted from its annotations as they stand. Each such change is reported once to `on_mismatch` (the service
makes it an event on the pod, a log line and a metric).

Owns reading a pod into a `PodRecord`; counting records against devices is `hami.scheduler.state`'s. Reads the
records already counted (under the state's lock) and never changes them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from hami.cluster.port import KubeObject, meta, pod_key, revision
from hami.codec import AnnotationError, decode_pod_devices
from hami.fitting import Grant, effective_grants
from hami.lifecycle import BIND_PHASE, TERMINAL_PHASES
from hami.model import ContainerPlacement, DeviceKind, PlacedPod, RunOrder
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignatureError, changed

__all__ = ["VGPU_NODE_ANNOTATION", "PodRecord", "PodUsage", "awaits_allocation"]

log = logging.getLogger(__name__)

VGPU_NODE_ANNOTATION = "hami.io/vgpu-node"


@dataclass
class PodRecord:
    key: str
    uid: str
    node: str
    order: RunOrder
    """Which of the pod's containers hold devices at the same time (its init containers and native sidecars)."""
    allocation: dict[str, tuple[ContainerPlacement, ...]]
    """kind → positional placements, as the allocated annotations (or the filter's assumption) say."""
    grants: dict[str, dict[str, Grant]] = field(default_factory=dict)
    """kind → device UUID → effective grant (`order`'s rule applied)."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    """The pod's annotations; for an assumed pod, those the filter wrote with its decision."""
    phase: str = ""
    assumed: bool = False
    version: int | None = None
    """The resourceVersion of the pod as counted: of the view read, or of the decision's write (None until the
    write of an assumed decision answers). Views older than it are not counted."""
    bound: bool = False
    """Bound to `node`: the watch saw `spec.nodeName`, or this scheduler's bind succeeded. What the scheduler
    knows here wins over what a request body claims."""
    decided: bool = False
    """The usage is the scheduler's own decision: assumed by its filter, or read from a verified signature."""
    priority: int = 0
    """spec.priority: only a pod of higher priority may preempt it (`hami.scheduler.preemption`)."""
    started: float = 0.0
    """When the pod was created (seconds since the epoch; 0 when unknown): the work a preemption would lose."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """The pod's labels, which PodDisruptionBudgets select by."""
    _placed: PlacedPod | None = field(default=None, repr=False, compare=False)

    def placed(self) -> PlacedPod:
        """The pod as node views list it (built once)."""
        if self._placed is None:
            namespace, _, name = self.key.partition("/")
            self._placed = PlacedPod(namespace=namespace, name=name, uid=self.uid, annotations=self.annotations)
        return self._placed


class PodUsage:
    """Reads pods into records, under signed placements when the scheduler has placement keys."""

    def __init__(self, kinds: list[DeviceKind], lock: threading.RLock, counted: Mapping[str, PodRecord]) -> None:
        self.kinds = kinds
        self._allocated = [(kind, kind.annotations.allocated) for kind in kinds]
        """Each kind with the name of its allocated annotation (read for every pod)."""
        self.lock = lock
        self.counted = counted
        """The records the state counts (read under `lock`): a signature that no longer verifies keeps its pod's."""
        self.signer: PlacementKeys | None = None
        """The placement keys: None reads usage from the annotations as they stand (HAMi's behaviour)."""
        self.on_mismatch: Callable[[KubeObject, str], None] = lambda pod, message: None
        """Called once per change of a pod's annotations that its signature does not cover, with why."""
        self._mismatches: dict[str, str] = {}

    def forget(self, key: str) -> None:
        """The pod is gone: a mismatch of a pod of the same name is reported again."""
        self._mismatches.pop(key, None)

    def record_of(self, pod: KubeObject) -> PodRecord | None:
        """What a pod uses, from its annotations; None when it uses no device or no longer counts."""
        m = meta(pod)
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        annotations: Mapping[str, str] = m.get("annotations") or {}
        phase = str(status.get("phase") or "")
        if phase in TERMINAL_PHASES:
            return None
        node = str(spec.get("nodeName") or annotations.get(VGPU_NODE_ANNOTATION) or "")
        if not node:
            return None
        decided = False
        if self.signer is not None:
            authentic = self._authentic(pod, node, annotations)
            if isinstance(authentic, PodRecord):
                return authentic
            annotations, decided = authentic
        total = len(spec.get("initContainers") or ()) + len(spec.get("containers") or ())
        allocation: dict[str, tuple[ContainerPlacement, ...]] = {}
        for kind, key in self._allocated:
            value = annotations.get(key)
            if not value:
                continue
            try:
                placements = decode_pod_devices(value, key)
            except AnnotationError as exc:
                log.warning(
                    "pod %s/%s: ignoring its %s usage: %s", m.get("namespace"), m.get("name"), kind.common_word, exc
                )
                continue
            if total and len(placements) != total:
                log.warning(
                    "pod %s/%s: %s lists %d containers, the pod has %d; counting it anyway",
                    m.get("namespace"), m.get("name"), kind.annotations.allocated, len(placements), total,
                )  # fmt: skip
            allocation[kind.common_word] = placements
        if not allocation:
            return None
        order = RunOrder.of_spec(spec)
        return PodRecord(
            key=pod_key(str(m.get("namespace") or "default"), str(m.get("name"))),
            uid=str(m.get("uid") or ""),
            node=node,
            order=order,
            allocation=allocation,
            grants=effective_grants(allocation, order),
            annotations=annotations,
            phase=phase,
            bound=bool(spec.get("nodeName")),
            decided=decided,
            version=revision(m.get("resourceVersion")),
            priority=_int(spec.get("priority")),
            started=_epoch(m.get("creationTimestamp")),
            labels=dict(m.get("labels") or {}),
        )

    def _authentic(
        self, pod: KubeObject, node: str, annotations: Mapping[str, str]
    ) -> tuple[Mapping[str, str], bool] | PodRecord:
        """The annotations to count a pod by under signed placements and whether they are the scheduler's
        decision, or the record already counted for it (kept when the signature no longer verifies)."""
        assert self.signer is not None
        m = meta(pod)
        key = pod_key(str(m.get("namespace") or "default"), str(m.get("name")))
        uid = str(m.get("uid") or "")
        with self.lock:
            previous = self.counted.get(key)
        if previous is not None and (previous.uid != uid or not previous.decided):
            previous = None
        try:
            placement = self.signer.verify(annotations, uid, node)
        except SignatureError as exc:
            if previous is not None:
                self._mismatch(pod, key, f"{exc}; keeping the usage the scheduler decided for it")
                return replace(
                    previous,
                    phase=str((pod.get("status") or {}).get("phase") or ""),
                    version=revision(m.get("resourceVersion")),
                    _placed=None,
                )
            if SIGNATURE_ANNOTATION in annotations:
                self._mismatch(pod, key, f"{exc}; counting its annotations as they stand")
            return annotations, False
        edited = changed(annotations, placement)
        if edited:
            self._mismatch(
                pod, key, f"{', '.join(edited)} changed since the scheduler signed them; counting the signed values"
            )
        else:
            self._mismatches.pop(key, None)
        return {**annotations, **placement.annotations}, True

    def _mismatch(self, pod: KubeObject, key: str, message: str) -> None:
        if self._mismatches.get(key) == message:
            return
        self._mismatches[key] = message
        try:
            self.on_mismatch(pod, message)
        except Exception:  # reporting must never stop the state from being kept
            log.exception("reporting the placement mismatch of pod %s failed", key)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _epoch(stamp: object) -> float:
    """An RFC 3339 timestamp as seconds since the epoch (0 when absent or unreadable)."""
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def awaits_allocation(record: PodRecord) -> bool:
    """The pod is decided onto its node but not yet allocated there: this scheduler's assumption, a placement
    written but not yet bound, or a bind whose Allocate has not answered (`hami.io/bind-phase: allocating`). Such a
    pod holds, or is about to take, the node's lock until the node daemon's Allocate finishes."""
    if record.assumed:
        return True
    phase = record.annotations.get(BIND_PHASE)
    if phase is None:
        return not record.bound and VGPU_NODE_ANNOTATION in record.annotations
    return phase == "allocating"
