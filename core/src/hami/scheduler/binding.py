"""Bind: the node lock, then the Binding carrying the pod's bind phase (and, with `record_at_bind`, its placement);
and the release of node locks whose owner no longer needs them.

A bind takes the node lock for the pod (and the vendors' own node locks of the kinds it was placed with,
`DeviceKind.node_lock`), waiting up to `bind_lock_wait_seconds` for a holder to finish, then creates the Binding
with `hami.io/bind-phase: allocating` and `hami.io/bind-time` (with `record_at_bind`, also the decision's placement
annotations and its `hami.io/vgpu-node` label) in its metadata: kube-apiserver sets a Binding's annotations on the
pod in the same write as its node (BindingREST's setPodNodeAndMetadata, k8s.io/kubernetes
pkg/registry/core/pod/storage, at 1.35.4 as long before), so the node side never sees a bound pod without its
placement, and the pod is written once instead of twice. A Binding's labels are set too only from 1.35 with
PodTopologyLabelsAdmission on (its default): a pod seen bound without its label is given it by a patch
(`observe_pod`), and later binds patch the placement before the Binding, as HAMi does. Any failure releases the
lock, marks the bind phase failed and is reported in the answer; a decision not yet written when a bind fails is
taken back, so that kube-scheduler's next filter of the pod decides afresh. What the scheduler's own state knows
wins over the request: a pod it knows bound is not bound again, and a bind for another UID than the one placed is
refused before anything is locked or written.

A node annotation lock is released by its holder's node daemon once Allocate ends; one whose owner is gone,
replaced, placed elsewhere or finished is released here (`release_finished_locks`, driven by the service's
watches), and a bind finding such a lock takes it over (`lock_holder_done`). A node whose daemon offers a Lease
(`hami.cluster.nodelease`) is locked through it: no Node write, and no release (the holder's bind phase, which the
pod watch delivers, frees it; `lock_holder_done` reads that).

Owns no decision: it takes the one the filter left (`hami.scheduler.pending`) and writes it through
`hami.scheduler.placement`. Thread-safety: binds run concurrently, one per request; the node locks serialise
them per node through the API server, and a waiting bind is woken by node and pod events (`notify_node_changed`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from hami.cluster.locks import NodeBusy, NodeLocks, VendorLock, VendorLockBusy, vendor_locks_of
from hami.cluster.port import Cluster, ClusterError, KubeObject, NotFoundError, meta, pod_key
from hami.codec import NodeLock
from hami.errors import HamiError
from hami.lifecycle import BIND_PHASE, BIND_TIME
from hami.model import Pod
from hami.plugins import VendorPlugins
from hami.scheduler.pending import PendingDecision, PendingDecisions
from hami.scheduler.placement import PlacementWriter
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import VGPU_NODE_ANNOTATION, ClusterState
from hami.transaction import Transaction

__all__ = ["BindResult", "Binder"]

log = logging.getLogger(__name__)


@dataclass
class BindResult:
    error: str = ""
    lock_wait: float = 0.0
    recorded: bool = False
    """The pod's placement annotations were written (so a failure after it leaves the decision standing)."""


class Binder:
    """Binds pods to the nodes their filter chose, under the node locks."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        state: ClusterState,
        settings: ExtenderSettings,
        pending: PendingDecisions,
        writer: PlacementWriter,
    ) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.state = state
        self.settings = settings
        self.pending = pending
        self.writer = writer
        self.on_lock_wait: Callable[[float], None] = lambda seconds: None
        self.node_changed = threading.Condition()
        self.locks = NodeLocks(
            cluster,
            expiry=timedelta(seconds=settings.lock_expiry_seconds),
            holder_done=self.lock_holder_done,
            wait_for_node=self._wait_for_node,
            known=self._known_node,
        )
        self.binding_copies_labels = True
        """Whether kube-apiserver sets a Binding's labels on the pod (`bound_without_label` finds out otherwise)."""
        self._labels_carried: dict[str, str] = {}  # pods bound with their placement label on the Binding: their node
        self._carried_lock = threading.Lock()

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind the pod to `node` (the caller has checked that this replica leads and is synced)."""
        known = self._known_binding(namespace, name, uid, node)
        if known is not None:
            return known
        pending: PendingDecision | None = None
        if self.settings.record_at_bind:
            pending = self.pending.take(namespace, name)
            if pending is None or pending.decision.node != node:
                # nothing decided here for this pod on that node (another process answered its filter, or none
                # did): binding it would leave the node side without a placement
                if pending is not None:
                    pending.undo.abandon("bound elsewhere than decided")
                return BindResult(
                    error=f"no placement of {namespace}/{name} on {node} is known to this scheduler; "
                    "kube-scheduler will retry the pod"
                )
        result = self._lock_and_bind(namespace, name, uid, node, pending)
        if result.error and pending is not None and not result.recorded:
            pending.undo.abandon("its bind failed")  # kube-scheduler filters the pod again
        return result

    def _lock_and_bind(
        self, namespace: str, name: str, uid: str, node: str, pending: PendingDecision | None
    ) -> BindResult:
        """Lock the node, write the decision (if not yet written) with `bind-phase: allocating`, bind.

        A pod whose every kind is served on the node by the vendor's own device plugin (no to-allocate key: Enflame's
        DRS, AWS Neuron) takes no node lock, as HAMi takes none for them: no node daemon would release it."""
        started = time.monotonic()
        kinds = self._pod_kinds(namespace, name)
        vendor_locks = vendor_locks_of(self.plugins.kind(k) for k in kinds)
        locking = not kinds or any(self.plugins.kind(k).annotations.to_allocate is not None for k in kinds)
        try:
            waited = (
                self.locks.acquire(
                    node, namespace, name, uid, wait=self.settings.bind_lock_wait_seconds, vendor_locks=vendor_locks
                )
                if locking
                else 0.0
            )
        except (NodeBusy, VendorLockBusy) as exc:
            self.on_lock_wait(time.monotonic() - started)
            return BindResult(error=f"{exc}; kube-scheduler will retry the pod")
        except ClusterError as exc:
            return BindResult(error=f"cannot lock node {node}: {exc}")
        self.on_lock_wait(waited)
        phase = {BIND_PHASE: "allocating", BIND_TIME: str(int(time.time()))}
        # The Binding carries the bind phase and, with `record_at_bind`, the placement (its label too, where the
        # API server copies a Binding's labels): one write of the pod, atomic with its node.
        carried = pending is None or self.binding_copies_labels
        written = pending is None  # the placement (written by the filter without `record_at_bind`)
        try:
            with Transaction() as undo:
                if locking:
                    undo.add(lambda: self.locks.release(node, namespace, name, vendor_locks), "the node locks")
                if pending is not None and not carried:  # its label would be lost: patched before the Binding
                    self.writer.write(pending.decision, also=phase)
                    written = True
                undo.add(lambda: self._mark_bind_failed(namespace, name), "the bind phase")
                if pending is None:
                    self.cluster.bind(namespace, name, uid, node, annotations=phase)
                elif carried:
                    annotations, labels = self.writer.placement(pending.decision, also=phase)
                    self._await_label(pod_key(namespace, name), node, undo)
                    self.cluster.bind(namespace, name, uid, node, annotations=annotations, labels=labels)
                else:
                    self.cluster.bind(namespace, name, uid, node)
                written = True
        except ClusterError as exc:
            if not written:
                carrier = " (the Binding carrying it failed)" if carried else ""  # nothing of it was written
                return BindResult(
                    error=f"could not record the placement of {namespace}/{name} on {node}{carrier}: {exc}; "
                    "kube-scheduler will retry the pod",
                    lock_wait=waited,
                )
            error = f"binding {namespace}/{name} to {node} failed: {exc}"
            return BindResult(error=error, lock_wait=waited, recorded=True)
        except BaseException:
            if pending is not None and not written:
                pending.undo.abandon("its bind failed")
            raise
        self.state.mark_bound(namespace, name, node)
        return BindResult(lock_wait=waited, recorded=True)

    def _await_label(self, key: str, node: str, undo: Transaction) -> None:
        """Check the pod's label once the watch shows it bound to `node` (`observe_pod`)."""
        with self._carried_lock:
            self._labels_carried[key] = node
        undo.add(lambda: self._forget_label(key), "the label check")

    def _forget_label(self, key: str) -> None:
        with self._carried_lock:
            self._labels_carried.pop(key, None)

    def observe_pod(self, pod: KubeObject, *, deleted: bool = False) -> None:
        """A pod's watch event: a pod bound with its placement label on the Binding whose label did not come
        through (an API server that drops a Binding's labels: before 1.35, or PodTopologyLabelsAdmission off) is
        given the label by a patch, and later binds patch the placement before binding, as HAMi does."""
        m = meta(pod)
        key = pod_key(str(m.get("namespace") or "default"), str(m.get("name")))
        with self._carried_lock:
            node = self._labels_carried.get(key)
            if node is None:
                return
            if not deleted and (pod.get("spec") or {}).get("nodeName") != node:
                return  # a view from before the Binding
            del self._labels_carried[key]
        if deleted or (m.get("labels") or {}).get(VGPU_NODE_ANNOTATION) == node:
            return
        if self.binding_copies_labels:
            log.warning(
                "the API server did not set the Binding's labels on pod %s: the placement label %s is patched "
                "from now on (kube-apiserver copies a Binding's labels from 1.35, PodTopologyLabelsAdmission)",
                key,
                VGPU_NODE_ANNOTATION,
            )
            self.binding_copies_labels = False
        try:
            self.cluster.patch_metadata(
                "pods", str(m.get("name")), key.split("/", 1)[0], labels={VGPU_NODE_ANNOTATION: node}
            )
        except ClusterError as exc:
            log.warning("could not label pod %s with its node: %s", key, exc)

    def _known_binding(self, namespace: str, name: str, uid: str, node: str) -> BindResult | None:
        """The answer the scheduler's own state gives a bind before anything is locked or written, or None to go on.

        A pod it knows bound is not bound again (to the same node with the same UID the bind is done: a retry is
        answered as such; elsewhere, or for another UID, an error), and a bind whose UID is not the one the pod
        was placed with is refused: a failed bind would otherwise still lock the node and mark the pod's bind
        phase, which the node side reads."""
        key = pod_key(namespace, name)
        with self.state.lock:
            record = self.state.pods.get(key)
            known = (record.uid, record.bound, record.node) if record is not None else None
        if known is None:
            return None
        known_uid, bound, placed = known
        if known_uid and uid != known_uid:
            return BindResult(error=f"pod {namespace}/{name} was placed with UID {known_uid}, not {uid}")
        if bound:
            if placed == node:
                return BindResult(recorded=True)
            return BindResult(error=f"pod {namespace}/{name} is already bound to {placed}")
        return None

    def _mark_bind_failed(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):  # a pod that is gone has no bind phase to mark
            self.cluster.patch_metadata("pods", name, namespace, annotations={BIND_PHASE: "failed"})

    def _every_vendor_lock(self) -> list[VendorLock]:
        return vendor_locks_of(self.plugins.kinds)

    def _pod_kinds(self, namespace: str, name: str) -> list[str]:
        """The device kinds the pod was placed with."""
        with self.state.lock:
            record = self.state.pods.get(pod_key(namespace, name))
            kinds = sorted(record.allocation) if record is not None else None
        if kinds is None:  # not seen by this replica's filter (e.g. a restart in between): ask the pod
            try:
                kinds = sorted(self.plugins.pod_requests(Pod.from_api(self.cluster.get("pods", name, namespace))))
            except (ClusterError, HamiError, ValueError):
                kinds = []
        return kinds

    # ---------------------------------------------------------------------------------- locks

    def _known_node(self, node: str) -> tuple[Mapping[str, str], str] | None:
        with self.state.lock:
            record = self.state.nodes.get(node)
            return (record.annotations, record.resource_version) if record is not None else None

    def _wait_for_node(self, node: str, seconds: float) -> None:
        with self.node_changed:
            self.node_changed.wait(seconds)

    def notify_node_changed(self) -> None:
        """Wake binds waiting for a node lock (called by the service on node watch events)."""
        with self.node_changed:
            self.node_changed.notify_all()

    def lock_holder_done(self, lock: NodeLock, node: str = "", *, allocated: bool = True) -> bool:
        """True when the lock (on `node`) no longer serves its owner: the owner is gone or replaced, placed or bound
        on another node, finished, or (with `allocated`) its allocation ended (bind phase success or failed).

        The watch-driven release passes `allocated=False`: the node side that wrote the phase releases the lock
        itself right after, and racing it costs both a read and a conflicting write per pod; a lock it leaves
        behind (a daemon that died in between) is still free to the next bind, which takes it over."""
        with self.state.lock:
            record = self.state.pods.get(pod_key(lock.namespace, lock.name))
        if record is None:
            try:
                pod = self.cluster.get("pods", lock.name, lock.namespace)
            except ClusterError:
                return True
            m = meta(pod)
            phase = (pod.get("status") or {}).get("phase")
            annotations = m.get("annotations") or {}
            bound = (pod.get("spec") or {}).get("nodeName")
            return bool(
                (lock.uid and m.get("uid") != lock.uid)
                or phase in ("Succeeded", "Failed")
                or (allocated and annotations.get(BIND_PHASE) in ("success", "failed"))
                or (node and bound and bound != node)
            )
        if lock.uid and record.uid and record.uid != lock.uid:
            return True
        if node and record.node and record.node != node:
            return True  # placed again elsewhere (e.g. after a scheduler restart mid-bind)
        return allocated and record.annotations.get(BIND_PHASE) in ("success", "failed")

    def release_finished_locks(self) -> list[str]:
        """Release every lock whose owner no longer needs it; returns the nodes released (watch-driven)."""
        released = []
        with self.state.lock:
            held = [(name, self.locks.holder(dict(r.annotations))) for name, r in self.state.nodes.items()]
        for node, lock in held:
            if (
                lock is not None
                and self.lock_holder_done(lock, node)
                and self.locks.release(node, lock.namespace, lock.name, self._every_vendor_lock())
            ):
                log.info(
                    "released lock of %s on node %s: its owner no longer needs it",
                    pod_key(lock.namespace, lock.name),
                    node,
                )
                released.append(node)
        return released
