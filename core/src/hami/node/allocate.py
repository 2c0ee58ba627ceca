"""The kubelet's Allocate: find the pod being started, serve its next containers, and leave the node unlocked.

Allocate carries device IDs only, no pod identity. The scheduler's bind locks the node for the pod
(`hami.io/mutex.lock`: time, namespace, name and this project's owner UID) and marks it
`hami.io/bind-phase: allocating`, so:

1. **Which pod.** The lock's owner, when that pod exists with the lock's UID and still has devices of this
   kind to allocate: the holder of the node's Lease first (`hami.cluster.nodelease`, the lock this project's
   scheduler takes where this daemon offers it), then the node annotation's (HAMi's scheduler's). An annotation
   lock whose owner is gone, was recreated or has finished allocating is stale: it is released (a Lease is never
   released here: its holder's bind phase frees it). Without a usable lock, the pod bound to this node with
   `bind-phase: allocating` and devices of this kind left is served only when it is the only one (HAMi takes the
   first it finds, which can hand one pod's devices to another); otherwise Allocate is refused, saying why.
2. **Which containers.** Each container request of the kubelet takes the pod's next container whose entry in
   the kind's to-allocate annotation is not empty (init containers first, HAMi's positional order), and the
   number of device IDs the kubelet gives must equal the number of devices the scheduler placed. The kubelet
   calls for init containers in spec order, native sidecars (`restartPolicy: Always`) among them, then for the
   app containers; a sidecar's entry sits at its position among the init containers, so it gets its own share.
3. **What the container gets.** The vendor's `hami_allocate` (e.g. create a partition), then its
   `hami_container_edits` (env, mounts, device nodes, CDI names) with the vendor's isolation library as the
   daemon installed it (`hami.node.hooklib`), as they are.
4. **Annotations.** The served entries of the to-allocate annotation are emptied (positions kept; the
   `…-allocated` annotation is left for usage accounting), in the same write as the pod annotations the
   vendor's allocations returned (`Allocation.pod_annotations`, e.g. the identity of a partition it created;
   the next container of the same call already sees them). When no kind of the pod has anything left,
   `bind-phase: success` is written in the same write (one request per pod; on a Lease-locked node it is also
   the lock's release) and an annotation lock released. On any failure once the pod is known,
   `bind-phase: failed` is written, the lock released, and the kubelet gets an error saying what was wrong.

**Signed placements.** With placement keys (`hami.signing`), a pod is served only when its
`hami.io/placement-signature` verifies for its UID and this node: each container's pending entry must equal
the one the scheduler signed in the kind's allocated annotation, and the vendor sees the signed values of the
annotations the signature covers, whatever the pod's owner wrote over them. A pod that reached the node
without the HAMi scheduler (webhook ignored, `nodeName` preset, another scheduler) has no signature and is
refused with an error saying so. The annotations this daemon writes back are signed again in the same write.
Without keys, pods are served as HAMi serves them (and the daemon says so in its log at start).

**Retries.** Before its first write to the API, each call records its answer in the Allocate journal
(`hami.node.journal`, on the host). A call is a retry of the journaled one for the pod and kind when the
same containers are still pending (the daemon died before its write landed), or nothing is left to
allocate for the kind (it died after, before the kubelet had the answer: the pod is then found through the
journal, the only pending pod of this node with an entry). A retry
gets the journaled answer, byte for byte, and finishes what the first call left undone (the annotations,
`bind-phase: success`, the lock), without asking the vendor again.

Every Allocate of the node runs under one lock (the node lock protocol assumes one pod at a time), in the
caller's thread: the gRPC layer calls it from a worker thread. Errors never escape as anything but
`AllocationError`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami.cluster.locks import LOCK_ANNOTATION, NodeLocks, vendor_locks_of
from hami.cluster.nodelease import DaemonLease
from hami.cluster.port import Cluster, ClusterError, ConflictError, KubeObject, NotFoundError, meta
from hami.codec import AnnotationError, NodeLock, decode_node_lock, decode_pod_devices, encode_pod_devices
from hami.errors import HamiError
from hami.isolation.grant import grant_host_dir, write_files
from hami.lifecycle import BIND_PHASE
from hami.model import ContainerEdits, ContainerPlacement, IsolationLibrary, Pod
from hami.node.journal import AllocationJournal, JournalEntry
from hami.node.pods import ServedContainer, node_of
from hami.plugins import VendorPlugins
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignatureError, SignedPlacement

__all__ = ["AllocationError", "Allocator"]

log = logging.getLogger(__name__)


RETRY_WINDOW = 120.0
WROTE_KEPT = 1024  # pods whose last write by this daemon is remembered (a node runs far fewer at once)
"""Seconds after an answer during which an Allocate finding nothing pending may be its retry."""


class AllocationError(HamiError):
    """Allocate cannot be served; the message is what the kubelet (and the pod's events) will show."""


@dataclass
class _Target:
    """The pod being started, as read from the API (for events) and as the device logic sees it."""

    obj: KubeObject
    pod: Pod
    leased: bool = False
    """Found as the holder of the node's Lease, which its bind phase frees: no lock for this daemon to release."""


def _entries(annotations: Mapping[str, str], key: str | None) -> list[ContainerPlacement]:
    value = annotations.get(key) or "" if key else ""
    return list(decode_pod_devices(value, key)) if value and key else []


def _has_work(annotations: Mapping[str, str], key: str | None) -> bool:
    try:
        return any(_entries(annotations, key))
    except AnnotationError:
        return True  # malformed: let the allocation itself report it


class Allocator:
    """Serves Allocate for every device kind of one node."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        node: str,
        *,
        on_served: Callable[[ServedContainer], None] | None = None,
        library_of: Callable[[str], IsolationLibrary | None] | None = None,
        placement_keys: PlacementKeys | None = None,
        journal: AllocationJournal | None = None,
        lease: DaemonLease | None = None,
    ) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.node = node
        self.on_served = on_served or (lambda container: None)
        self.library_of = library_of or (lambda vendor: None)
        """Vendor name → its isolation library as installed on this host, or None."""
        self.placement_keys = placement_keys
        """Serve only placements whose signature verifies; None: serve the annotations as they are (HAMi)."""
        self.journal = journal
        """Where answers are kept for the kubelet's retries; None: a retry after a lost answer is refused."""
        self.locks = NodeLocks(cluster)
        self.lease = lease
        """The node's lock Lease (`hami.cluster.nodelease`), read before the node annotation lock; None: only the
        annotation lock (HAMi's)."""
        self._serial = threading.Lock()
        self._wrote: OrderedDict[str, str] = OrderedDict()
        """Pod UID → the resourceVersion of this daemon's last write of it (the latest `WROTE_KEPT`): a pod read
        from the API server's watch cache is used only when it is not from before that write."""

    def allocate(self, kind: str, requests: Sequence[Sequence[str]]) -> list[ContainerEdits]:
        """The edits for each container request (device IDs from the kubelet), in order.

        :raises AllocationError: the pod cannot be found or served; the message says why.
        """
        with self._serial:
            started = time.monotonic()
            try:
                target = self._find_pod(kind, requests)
            except AllocationError:
                raise
            except (HamiError, ClusterError) as exc:
                raise AllocationError(f"cannot find the pod being started on node {self.node}: {exc}") from None
            except Exception as exc:
                log.exception("finding the pod to allocate on node %s failed", self.node)
                raise AllocationError(f"internal error finding the pod on node {self.node}: {exc!r}") from None
            name = f"{target.pod.namespace}/{target.pod.name}"
            try:
                edits = self._serve(kind, target, requests)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, HamiError | ClusterError) else f"internal error: {exc!r}"
                if not isinstance(exc, HamiError | ClusterError):
                    log.exception("allocating %s devices for pod %s failed", kind, name)
                self._fail(target, f"cannot allocate {kind} devices on node {self.node}: {reason}")
                raise AllocationError(f"pod {name}: {reason}") from None
            log.info(
                "allocated %d container(s) of pod %s with %s devices in %.1f ms",
                len(edits), name, kind, (time.monotonic() - started) * 1000,
            )  # fmt: skip
            return edits

    def pending_placements(self, kind: str) -> tuple[Pod, list[tuple[str, ContainerPlacement]]] | None:
        """The pod the next Allocate of `kind` will serve and its containers still to serve, in order, as (name,
        placement): the signed placement where placements are signed. None when no pod is found or its
        annotations cannot be read (Allocate then says why). For GetPreferredAllocation, which comes first."""
        key = self.plugins.kind(kind).annotations.to_allocate
        try:
            with self._serial:
                target = self._find_pod(kind)
            pod = target.pod
            entries = _entries(pod.annotations, key)
            if self.placement_keys is not None:
                _, signed = self._signed(pod, kind, self.plugins.kind(kind).annotations.allocated)
                entries = [signed[i] if e and i < len(signed) else e for i, e in enumerate(entries)]
        except (HamiError, ClusterError) as exc:
            log.debug("GetPreferredAllocation of %s on node %s: no pod to prefer for: %s", kind, self.node, exc)
            return None
        names = [c.name for c in pod.all_containers]
        return pod, [(names[i] if i < len(names) else str(i), e) for i, e in enumerate(entries) if e]

    # ---------------------------------------------------------------------------------- which pod

    def _find_pod(self, kind: str, requests: Sequence[Sequence[str]] = ()) -> _Target:
        key = self.plugins.kind(kind).annotations.to_allocate
        if key is None:
            raise AllocationError(
                f"{kind} devices are served on the node by the vendor's own device plugin, as in HAMi, not by this "
                "daemon: install it on the node"
            )
        if self.lease is not None:
            # First as the API server's watch cache has them, where the kubelet saw the pod bound, so they are as
            # recent as the bind: no read of etcd. Read again from etcd when that does not name the pod to serve.
            for recent in (True, False):
                leased_by = self.lease.holder(recent=recent)
                target = self._lock_owner(leased_by, key, leased=True, recent=recent) if leased_by else None
                if target is not None:
                    return target
        node_obj = self.cluster.get("nodes", self.node)
        lock = self._lock_of(node_obj)
        owner: str | None = None
        if lock is not None and lock.name:
            owner = f"{lock.namespace}/{lock.name}"
            target = self._lock_owner(lock, key)
            if target is not None:
                return target
        candidates = []
        pods, _ = self.cluster.list("pods")
        for obj in pods:
            m = meta(obj)
            annotations = m.get("annotations") or {}
            if (
                node_of(obj) == self.node
                and annotations.get(BIND_PHASE) == "allocating"
                and (obj.get("status") or {}).get("phase") in (None, "", "Pending")
                and f"{m.get('namespace')}/{m.get('name')}" != owner
                and _has_work(annotations, key)
            ):
                candidates.append(obj)
        if len(candidates) > 1 and self.placement_keys is not None:  # a forged pod cannot make the real one wait
            candidates = [o for o in candidates if self._verified(o)] or candidates
        if len(candidates) == 1:
            obj = candidates[0]
            log.info("node %s has no usable lock; serving %s, the only pod allocating here", self.node, _name(obj))
            return _Target(obj, Pod.from_api(obj))
        if not candidates and (retried := self._retried(kind, requests)) is not None:
            return retried
        if not candidates:
            held = f"the lock names pod {owner}, which has no {kind} devices left to allocate" if owner else "no lock"
            raise AllocationError(
                f"no pod is waiting for {kind} devices on node {self.node}: {held}, and no pod bound here has "
                f"bind-phase allocating with devices in {key}. Was the pod scheduled by the HAMi scheduler "
                "(schedulerName), and did its bind succeed?"
            )
        names = ", ".join(sorted(_name(o) for o in candidates))
        raise AllocationError(
            f"node {self.node} has no lock naming the pod being started, and {len(candidates)} pods are allocating "
            f"{kind} devices here ({names}): refusing to guess which one the kubelet is starting"
        )

    def _before_own_write(self, obj: KubeObject) -> bool:
        """Whether `obj` may be a version of a pod from before this daemon's last write of it."""
        m = meta(obj)
        wrote = self._wrote.get(str(m.get("uid") or ""))
        return wrote is not None and wrote != m.get("resourceVersion")

    def _wrote_pod(self, obj: KubeObject) -> KubeObject:
        """Remember the version of a pod this daemon wrote (`_before_own_write`); returns `obj`."""
        m = meta(obj)
        uid, version = str(m.get("uid") or ""), str(m.get("resourceVersion") or "")
        if uid:
            self._wrote[uid] = version
            self._wrote.move_to_end(uid)
            while len(self._wrote) > WROTE_KEPT:
                self._wrote.popitem(last=False)
        return obj

    def _lock_of(self, node_obj: KubeObject) -> NodeLock | None:
        value = (meta(node_obj).get("annotations") or {}).get(LOCK_ANNOTATION)
        if not value:
            return None
        try:
            return decode_node_lock(value, LOCK_ANNOTATION)
        except AnnotationError as exc:
            log.warning("node %s: ignoring a malformed lock: %s", self.node, exc)
            return None

    def _lock_owner(self, lock: NodeLock, key: str, *, leased: bool = False, recent: bool = False) -> _Target | None:
        """The lock's owner when it is the pod to serve; releases an annotation lock whose owner no longer needs it
        (a Lease's holder stops holding it by itself: the scheduler reads that from the pod). `recent`: the pod as
        the API server's watch cache has it (a Lease's holder only: nothing is released on what it says)."""
        owner = f"{lock.namespace}/{lock.name}"
        release = (lambda: None) if leased else (lambda: self.locks.release(self.node, lock.namespace, lock.name))
        try:
            obj = self.cluster.get("pods", lock.name, lock.namespace, recent=recent)
            if recent and self._before_own_write(obj):
                # the kubelet asks for the next container as soon as the last one is answered: the cache may not
                # have that answer's write yet, and a pod this daemon wrote is used only as it wrote it
                obj = self.cluster.get("pods", lock.name, lock.namespace)
        except NotFoundError:
            log.info("node %s is locked for pod %s, which no longer exists", self.node, owner)
            release()
            return None
        m = meta(obj)
        annotations = m.get("annotations") or {}
        if lock.uid and m.get("uid") != lock.uid:
            log.info("node %s is locked for an earlier pod named %s (UID %s)", self.node, owner, lock.uid)
            release()
            return None
        if annotations.get(BIND_PHASE) in ("success", "failed") or not self._needs_any(annotations):
            if not leased:
                log.warning("node %s is locked for pod %s, whose allocation is over: releasing", self.node, owner)
            release()
            return None
        if not _has_work(annotations, key) or (leased and node_of(obj) != self.node):
            return None  # the owner still allocates other kinds: it is not the pod asking for this one
        return _Target(obj, Pod.from_api(obj), leased=leased)

    def _verified(self, obj: KubeObject) -> bool:
        assert self.placement_keys is not None
        m = meta(obj)
        try:
            self.placement_keys.verify(m.get("annotations") or {}, str(m.get("uid") or ""), self.node)
        except SignatureError:
            return False
        return True

    def _signed(self, pod: Pod, kind: str, allocated: str) -> tuple[SignedPlacement, list[ContainerPlacement]]:
        """The pod's verified placement and the kind's signed entries.

        :raises AllocationError: the signature is absent, does not verify, or names no devices of the kind."""
        assert self.placement_keys is not None
        name = f"{pod.namespace}/{pod.name}"
        try:
            placement = self.placement_keys.verify(pod.annotations, pod.uid, self.node)
        except SignatureError as exc:
            how = (
                "it was not placed by the HAMi scheduler (is its schedulerName the HAMi scheduler's? a pod with "
                "hami.io/webhook: ignore or a preset nodeName skips it)"
                if SIGNATURE_ANNOTATION not in pod.annotations
                else "its placement was edited after the scheduler signed it, or signed with a retired key"
            )
            raise AllocationError(
                f"pod {name} has no valid placement signature on node {self.node} ({exc}): {how}; this node "
                "serves shared devices only to placements the HAMi scheduler signed. Delete the pod and let the "
                "HAMi scheduler place it"
            ) from None
        try:
            signed = _entries(placement.annotations, allocated)
        except AnnotationError as exc:
            raise AllocationError(f"pod {name}: its signed placement is unreadable: {exc}") from None
        if not any(signed):
            raise AllocationError(
                f"pod {name}: the scheduler's signed placement has no {kind} devices for it; "
                "its annotations were edited to ask for devices it was not given"
            )
        return placement, signed

    def _retried(self, kind: str, requests: Sequence[Sequence[str]]) -> _Target | None:
        """The pod whose journaled call this Allocate retries, when nothing else is pending: the only pod of this
        node still Pending, with the journal entry's UID, whose entry for the kind is recent (`RETRY_WINDOW`)
        and was given the same device IDs by the kubelet. (Another pod that reaches Allocate without
        anything to allocate is not answered with this pod's devices.)"""
        if self.journal is None:
            return None
        found: list[KubeObject] = []
        given = tuple(tuple(r) for r in requests)
        for entry in self.journal.entries(kind):
            if entry.requests != given or time.time() - entry.time > RETRY_WINDOW:
                continue
            try:
                obj = self.cluster.get("pods", entry.name, entry.namespace)
            except NotFoundError:
                continue
            if (
                meta(obj).get("uid") == entry.uid
                and node_of(obj) == self.node
                and (obj.get("status") or {}).get("phase") in (None, "", "Pending")
            ):
                found.append(obj)
        if len(found) != 1:
            return None
        log.info("node %s: nothing pending for %s; taking it as a retry of pod %s", self.node, kind, _name(found[0]))
        return _Target(found[0], Pod.from_api(found[0]))

    def _needs_any(self, annotations: Mapping[str, str]) -> bool:
        return any(_has_work(annotations, k.annotations.to_allocate) for k in self.plugins.kinds)

    # ---------------------------------------------------------------------------------- serving

    def _serve(self, kind: str, target: _Target, requests: Sequence[Sequence[str]]) -> list[ContainerEdits]:
        pod = target.pod
        keys = self.plugins.kind(kind).annotations
        key = keys.to_allocate
        assert key is not None  # `_find_pod` refuses a kind this daemon does not serve
        entries = _entries(pod.annotations, key)
        signed: list[ContainerPlacement] | None = None
        placement_signed: SignedPlacement | None = None
        signer = self.placement_keys
        if signer is not None:
            placement_signed, signed = self._signed(pod, kind, keys.allocated)
            pod = pod.model_copy(update={"annotations": {**pod.annotations, **placement_signed.annotations}})
        containers = pod.all_containers
        if len(entries) > len(containers):
            raise AllocationError(
                f"{key} has {len(entries)} container entries but the pod has {len(containers)} containers"
            )
        journaled = self.journal.get(pod.uid, kind) if self.journal is not None else None
        if journaled is not None and _retries(journaled, requests, entries):
            log.info("pod %s/%s: answering a retried Allocate of %s from the journal", pod.namespace, pod.name, kind)
            for at, devices, done in zip(journaled.containers, journaled.placements, journaled.edits, strict=True):
                name = containers[at].name
                record = ServedContainer(
                    pod.namespace, pod.name, pod.uid, name, at, kind, devices, done.accounting_file,
                    grant_host_dir(done.mounts),
                )  # fmt: skip
                self.on_served(record)
                entries[at] = ()
            self._commit(target, key, entries, dict(journaled.annotations))
            return list(journaled.edits)
        served: list[ServedContainer] = []
        answers: list[ContainerEdits] = []
        written: dict[str, str] = {}
        node_written: dict[str, str | None] = {}
        library = self.library_of(self.plugins.owner(kind).name)
        for request in requests:
            index = next((i for i, e in enumerate(entries) if e), None)
            if index is None:
                raise AllocationError(
                    f"the kubelet asked for {len(requests)} container(s) of {kind} devices, but only {len(served)} "
                    f"had devices left in {key}"
                )
            container = containers[index].name
            placement = entries[index]
            if signed is not None and (index >= len(signed) or signed[index] != placement):
                raise AllocationError(
                    f"container {container}: entry {index} of {key} is not the placement the scheduler signed "
                    f"for it ({keys.allocated}); its annotations were edited after scheduling"
                )
            if len(request) != len(placement):
                raise AllocationError(
                    f"container {container} was given {len(request)} {kind} device ID(s) by the kubelet, but the "
                    f"scheduler placed {len(placement)} device(s) for it ({', '.join(d.uuid for d in placement)})"
                )
            allocation = self.plugins.allocate(kind, pod, index, placement)
            placement = allocation.devices
            if allocation.pod_annotations:
                written.update(allocation.pod_annotations)
                pod = pod.model_copy(update={"annotations": {**pod.annotations, **allocation.pod_annotations}})
            node_written.update(allocation.node_annotations)
            edits = self.plugins.container_edits(kind, pod, index, placement, library)
            try:
                write_files(edits.files)  # the grant, before the container can start
            except OSError as exc:
                raise AllocationError(f"cannot write {exc.filename} for {container}: {exc.strerror}") from None
            answers.append(edits)
            record = ServedContainer(
                pod.namespace, pod.name, pod.uid, container, index, kind, placement, edits.accounting_file,
                grant_host_dir(edits.mounts),
            )  # fmt: skip
            self.on_served(record)  # before anything else can fail: what hami_allocate made is released later
            served.append(record)
            entries[index] = ()
        if signer is not None and placement_signed is not None and written:
            resigned = SignedPlacement(pod.uid, self.node, {**placement_signed.annotations, **written})
            written[SIGNATURE_ANNOTATION] = signer.sign(resigned)
        if self.journal is not None:
            entry = JournalEntry(
                pod.uid, pod.namespace, pod.name, kind, tuple(s.index for s in served),
                tuple(s.devices for s in served), tuple(answers), time.time(),
                tuple(tuple(r) for r in requests), written,
            )  # fmt: skip
            try:
                self.journal.record(entry)
            except OSError as exc:  # serving matters more; only a retry after a crash would miss it
                log.error("pod %s/%s: cannot journal its Allocate answer: %s", pod.namespace, pod.name, exc)
        self._commit(target, key, entries, written, node_written)
        return answers

    def _commit(
        self,
        target: _Target,
        key: str,
        entries: Sequence[ContainerPlacement],
        written: Mapping[str, str],
        node_written: Mapping[str, str | None] | None = None,
    ) -> None:
        """Write the served entries and the call's annotations (the pod's, then the vendors' node annotations);
        when nothing is left, success and the lock. A retry answered from the journal writes no node annotations:
        the journal keeps the pod's side, which is what decides the answer.

        When this write leaves the pod nothing to allocate, `bind-phase: success` goes in the same write, on the
        condition that the pod is as read (its resourceVersion): a pod changed since is written in two steps,
        the phase decided on what the first write returns. On a node locked through its Lease, that one write is
        also the lock's release."""
        pod = target.pod
        m = meta(target.obj)
        served = {**written, key: encode_pod_devices(entries)}
        patched: KubeObject | None = None
        if m.get("resourceVersion") and not self._needs_any({**(m.get("annotations") or {}), **served}):
            try:
                patched = self._wrote_pod(self.cluster.patch_metadata(
                    "pods", pod.name, pod.namespace, annotations={**served, BIND_PHASE: "success"},
                    resource_version=str(m["resourceVersion"]),
                ))  # fmt: skip
            except ConflictError:
                patched = None
        done = patched is not None
        if patched is None:
            patched = self._wrote_pod(self.cluster.patch_metadata("pods", pod.name, pod.namespace, annotations=served))
        self._write_node_annotations(node_written or {})
        if done or not self._needs_any(meta(patched).get("annotations") or {}):
            if not done:
                self._wrote_pod(
                    self.cluster.patch_metadata("pods", pod.name, pod.namespace, annotations={BIND_PHASE: "success"})
                )
            if target.leased:
                return
            try:
                self.locks.release(self.node, pod.namespace, pod.name)
            except ClusterError as exc:  # the pod is allocated; the scheduler frees locks of finished owners
                log.warning("pod %s/%s allocated, but releasing node %s failed: %s", pod.namespace, pod.name,
                            self.node, exc)  # fmt: skip

    def _write_node_annotations(self, annotations: Mapping[str, str | None]) -> None:
        """The vendors' node annotations of this Allocate (`Allocation.node_annotations`), less the daemon's own."""
        owned = {LOCK_ANNOTATION}
        for k in self.plugins.kinds:
            owned.update(key for key in (k.annotations.node_register, k.annotations.node_handshake) if key)
        wanted = {k: v for k, v in annotations.items() if k not in owned}
        if not wanted:
            return
        try:
            self.cluster.patch_metadata("nodes", self.node, annotations=wanted)
        except ClusterError as exc:  # the pod is served; the vendor's annotation is what is late
            log.warning("writing %s on node %s failed: %s", ", ".join(sorted(wanted)), self.node, exc)

    def _fail(self, target: _Target, message: str) -> None:
        """Mark the pod's binding failed, say why in an event, release the node lock if the pod holds it.

        Never raises: the kubelet must get its answer whatever the API does.
        """
        pod = target.pod
        with contextlib.suppress(Exception):
            self._wrote_pod(
                self.cluster.patch_metadata("pods", pod.name, pod.namespace, annotations={BIND_PHASE: "failed"})
            )
        with contextlib.suppress(Exception):
            self.cluster.record_event(target.obj, "DeviceAllocationFailed", message, warning=True)
        if target.leased:
            return  # the failed phase frees the Lease
        try:  # with the vendor locks bind took with it
            self.locks.release(self.node, pod.namespace, pod.name, vendor_locks_of(self.plugins.kinds))
        except Exception:
            log.exception("could not release the lock of node %s held by %s/%s", self.node, pod.namespace, pod.name)


def _retries(entry: JournalEntry, requests: Sequence[Sequence[str]], entries: Sequence[ContainerPlacement]) -> bool:
    """Whether a call with `requests`, finding `entries` pending, retries the journaled call `entry`: the same
    containers are still pending (the first call's write never landed), or nothing is (it landed).

    The kubelet's device IDs do not tell a retry from the next container's call: it hands init containers'
    devices on to app containers. So a lost answer for a pod's earlier call, retried after its later calls
    were made, is not recognised (the kubelet fails the pod's admission on the first error anyway)."""
    if not entry.answers(requests):
        return False
    pending = tuple(i for i, e in enumerate(entries) if e)
    return not pending or pending[: len(entry.containers)] == entry.containers


def _name(obj: KubeObject) -> str:
    m = meta(obj)
    return f"{m.get('namespace', 'default')}/{m.get('name', '?')}"
