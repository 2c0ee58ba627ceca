"""The running scheduler: keeps `ClusterState` current from watches and frees node locks as events arrive.

Start-up lists nodes and pods, rebuilds the state from scratch (the same objects give the same usage, so a
restart changes nothing), seeds the fragmentation-aware policy's learned workload with the live pods' requests,
then watches both. Each pod event may end a node lock's purpose (the owner was deleted, replaced or placed
elsewhere), so the lock of the pod's node is checked and released at once instead of waiting out HAMi's 5
minutes; an owner whose allocation finished is left to the node side, which releases the lock after writing the
bind phase (and whose lock, should it not, is free to the next bind). A watch that breaks is re-established from
a fresh list.

Concurrency: watch handlers run on the backend's delivery threads and take the state lock briefly; filter
and bind run on the HTTP server's threads. A handler first steps aside while a filter decides
(`hami.scheduler.precedence`): kube-scheduler waits on the filter, nothing waits on the event.
Only the leader writes (see `hami.scheduler.leader`).
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from dataclasses import dataclass, field

from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.nodelease import lease_ref
from hami.cluster.port import (
    Cluster,
    ClusterError,
    KubeObject,
    Subscription,
    WatchEvent,
    list_pages,
    meta,
    pod_key,
)
from hami.config import LeaderElectionConfig
from hami.plugins import VendorPlugins
from hami.quota import QuotaLedger
from hami.scheduler.extender import Extender, ExtenderSettings
from hami.scheduler.handshake import HandshakeKeeper
from hami.scheduler.leader import LeaderElector, process_identity
from hami.scheduler.metrics import SchedulerMetrics
from hami.scheduler.preempting import Preempting
from hami.scheduler.requeue import Requeuer
from hami.scheduler.state import TERMINAL_PHASES, VGPU_NODE_ANNOTATION, ClusterState
from hami.signing import KEYS_ENVIRONMENT, PlacementKeys

__all__ = ["SchedulerService"]

log = logging.getLogger(__name__)

GC_YOUNG_THRESHOLD = 50_000
"""Allocations between young-generation GC passes in the scheduler process (CPython's default: 700)."""

LIST_ATTEMPTS = 3
"""Lists of the pods at start-up before giving up, when each expires part-way (a list of more than etcd's
compaction interval, 5 minutes by default)."""


class _Newest:
    """The `count` newest of the pods offered by creationTimestamp (the later offered first among equals), without
    keeping the others: what `Extender.learn_from` reads of a list given a page at a time."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._kept: list[tuple[str, int, KubeObject]] = []

    def offer(self, pod: KubeObject) -> None:
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES or self.count <= 0:
            return  # `learn_from` reads live pods only
        self._kept.append((str(meta(pod).get("creationTimestamp") or ""), len(self._kept), pod))
        if len(self._kept) >= 2 * self.count:  # now and then, the newest `count` of them: one sort per `count` pods
            self._kept = self._newest()

    def _newest(self) -> list[tuple[str, int, KubeObject]]:
        newest = sorted(self._kept, key=lambda e: e[:2])[-self.count :]
        return [(stamp, order, pod) for order, (stamp, _, pod) in enumerate(newest)]

    def pods(self) -> list[KubeObject]:
        """The pods kept, oldest first."""
        return [pod for *_, pod in self._newest()]


@dataclass
class SchedulerService:
    cluster: Cluster
    plugins: VendorPlugins
    settings: ExtenderSettings = field(default_factory=ExtenderSettings)
    leader_election: LeaderElectionConfig | None = None
    """None: this replica always leads (a single scheduler)."""
    placement_keys: PlacementKeys | None = field(default_factory=PlacementKeys.from_environment)
    """Signs each placement and verifies the pods' (`hami.signing`); None: HAMi's unsigned annotations."""
    identity: str = field(default_factory=process_identity)

    def __post_init__(self) -> None:
        self.state = ClusterState(self.plugins)
        self.state.usage.signer = self.placement_keys
        self.state.usage.on_mismatch = self._placement_mismatch
        self.extender = Extender(self.cluster, self.plugins, self.state, self.settings)
        self.metrics = SchedulerMetrics(self.state, self.plugins)
        self.extender.on_filter_result = self.metrics.record_filter
        self.extender.binder.on_lock_wait = self.metrics.observe_lock_wait
        self.elector: LeaderElector | None = None
        if self.leader_election is not None and self.leader_election.enabled:
            duration = self.leader_election.lease_duration_seconds
            self.elector = LeaderElector(
                self.cluster,
                name=self.leader_election.name,
                namespace=self.leader_election.namespace,
                identity=self.identity,
                lease_duration=duration,
                renew_deadline=duration * 2 / 3,
                retry_period=duration / 7.5,
                on_started_leading=lambda: self.metrics.set_leader(True),
                on_stopped_leading=lambda: self.metrics.set_leader(False),
            )
            elector = self.elector
            self.extender.is_leader = lambda: elector.is_leader
        else:
            self.metrics.set_leader(True)
        self.requeue = Requeuer(self.cluster, is_leader=lambda: self.extender.is_leader())
        self.requeue.on_nudge = self.metrics.requeues.inc
        self.extender.requeue = self.requeue
        self._subs: list[Subscription] = []
        self._ready = threading.Event()
        self.ledger = QuotaLedger(self.cluster, self.plugins)
        self.metrics.watch_quotas(self.ledger)
        """Namespace quotas, shared with a hosted webhook; counting once `start` synced it."""
        self.extender.synced = self._ready.is_set
        self._waiting: set[str] = set()
        """Pods addressed to a HAMi scheduler (`spec.schedulerName` hami-…) that wait for a node."""
        from hami.scheduler.claims import ClaimTracker  # here: hami.dra loads only where DRA is configured

        self.claims = ClaimTracker(self.state, self.settings.dra_driver) if self.settings.dra_driver else None
        """The DRA claims counted as usage (`draDriver` set)."""
        if self.settings.preemption_enabled:
            self.extender.preempting = Preempting(
                self.cluster,
                self.plugins,
                self.state,
                hold_seconds=self.settings.preemption_hold_seconds,
                dry_run=self.settings.preemption_dry_run,
            )
            self.extender.preempting.on_result = self.metrics.record_preemption

    def _placement_mismatch(self, pod: KubeObject, message: str) -> None:
        """A pod's annotations no longer match its signed placement: log line, metric, event on the pod."""
        m = meta(pod)
        log.warning("pod %s/%s: placement signature mismatch: %s", m.get("namespace"), m.get("name"), message)
        self.metrics.placement_mismatches.inc()
        self.cluster.record_event(pod, "PlacementSignatureMismatch", message, warning=True)

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def waiting(self) -> int:
        """How many pods addressed to a HAMi scheduler wait for a node (pending, unbound)."""
        return len(self._waiting)

    def _track_waiting(self, key: str, pod: KubeObject | None) -> None:
        spec = (pod.get("spec") or {}) if pod is not None else {}
        phase = ((pod.get("status") or {}).get("phase") or "Pending") if pod is not None else ""
        if phase == "Pending" and not spec.get("nodeName") and str(spec.get("schedulerName") or "").startswith("hami"):
            self._waiting.add(key)
        else:
            self._waiting.discard(key)

    def start(self) -> SchedulerService:
        """List, rebuild the state, watch: synced when this returns (`ready`). The cyclic GC is off meanwhile:
        the sync allocates millions of long-lived objects, and the full passes CPython runs while the heap grows
        cost a third of the replay (0.35 of 1.0 s at 1,000 nodes and 8,000 pods); the heap is frozen after it."""
        gc.disable()
        try:
            return self._sync()
        finally:
            gc.enable()

    def _sync(self) -> SchedulerService:
        if self.placement_keys is None:
            log.warning(
                "placement signing is OFF (%s unset): placements are written unsigned and usage is read from pod "
                "annotations as they stand, which a tenant allowed to patch its pods can rewrite",
                KEYS_ENVIRONMENT,
            )
        else:
            log.info("placement signing on: keys from %s", self.placement_keys.source)
        began = time.perf_counter()
        before: set[str] = set()
        attempt = 1
        while True:
            fed: set[str] = set()
            try:
                listed, node_rv, pod_rv, learned = self._replay(before, fed)
                break
            except ClusterError as exc:  # the pods' continue token expired part-way: list them again
                if exc.status != 410 or attempt == LIST_ATTEMPTS:
                    raise
                attempt += 1
                before |= fed
                log.warning("listing the pods again (attempt %d of %d): %s", attempt, LIST_ATTEMPTS, exc)
        self.extender.quota = self.ledger
        self._subs = [
            self.cluster.watch("nodes", node_rv, self._on_node),
            self.cluster.watch("pods", pod_rv, self._on_pod),
        ]
        if self.claims is not None:
            claims, claim_rv = self.cluster.list("resourceclaims")
            for claim in claims:
                self.claims.set_claim(claim)
            self._subs.append(self.cluster.watch("resourceclaims", claim_rv, self._on_claim))
        self.handshake = HandshakeKeeper(
            self.cluster,
            self.plugins,
            self.state,
            interval=self.settings.handshake_interval_seconds,
            is_leader=self.extender.is_leader,
        ).start()
        # The state is millions of long-lived objects: a full cyclic-GC pass over them stalls a filter for about
        # half a second at 5,000 nodes. Keep them out of later passes (freeze); and since a frozen heap no longer
        # holds full passes back (CPython runs one when a quarter of the unfrozen objects are new), space the passes
        # out: a filter allocates thousands of short-lived objects. Filter p99 at 5,000 nodes, in process: 20.8 ms
        # with freeze alone, 7.6 ms without freeze (but half-second stalls), 4.7 ms with both. No collection comes
        # first: the sync leaves no cyclic garbage for the freeze to keep (tests/scheduler/test_sync.py), and one
        # cost 0.25-0.34 s of the time until ready at 1,000 nodes and 8,000 pods to find nothing.
        replayed = time.perf_counter()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, 20, 100)
        done = time.perf_counter()
        log.info(
            "scheduler state synced in %.2f s (list and replay %.2f, watches %.2f, freeze %.2f): "
            "%d nodes, %d pods using devices; workload learned from %d pods",
            done - began,
            listed - began,
            replayed - listed,
            done - replayed,
            len(self.state.nodes),
            len(self.state.pods),
            learned,
        )
        self._ready.set()
        if self.elector is not None:
            self.elector.start()
        threading.Thread(target=self._learn_leases, name="learn-leases", daemon=True).start()
        self.extender.binder.release_finished_locks()
        return self

    def _replay(self, before: set[str], fed: set[str]) -> tuple[float, str, str, int]:
        """List the nodes and the pods and rebuild everything the service keeps of them: the state, the holds, the
        learned workload, the pods waiting, the gangs, the pods seen and the quota ledger. The pods are read a page
        at a time (`list_pages`) and each page is counted while the API server serves the next, so the whole list
        is never held (at 5,000 nodes and 40,000 pods, about 350 MiB of objects) and the listing and the counting
        overlap. `fed` receives the key of each pod fed; `before`: the pods fed by attempts that failed part-way,
        those no longer listed forgotten. Returns when the pods were all listed, the nodes' and the pods' versions,
        and the pods learned from."""
        pages = list_pages(self.cluster, "pods")  # the first page is fetched while the nodes are listed
        nodes, node_rv = self.cluster.list("nodes")
        self.state.replay(nodes, ())
        del nodes
        self.ledger.begin()  # the ledger counts from this service's pods and pod events: one list and watch of pods
        newest = _Newest(self.extender.workload.window)
        holds = self.extender.preempting.holds if self.extender.preempting is not None else None
        self._waiting.clear()
        try:
            for page in pages:
                if holds is not None:  # holds written before a restart keep their room
                    holds.adopt(page)
                for pod in page:
                    self.state.set_pod(pod)
                    m = meta(pod)
                    namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
                    key = pod_key(namespace, name)
                    fed.add(key)
                    self._track_waiting(key, pod)
                    self.extender.gangs.observe(pod)
                    self.extender.pending.pod_seen(namespace, name, str(m.get("uid") or ""), m.get("resourceVersion"))
                    self.ledger.set_pod(pod)
                    newest.offer(pod)
                del page
        finally:
            pages.close()
        listed = time.perf_counter()
        pod_rv = pages.version
        for key in before - fed:  # fed by a failed attempt, gone since
            namespace, _, name = key.partition("/")
            self.extender.gangs.forget(namespace, name)
            self.extender.pending.forget(namespace, name)
        self.extender.pending.pods_watched_to(pod_rv)
        learned = self.extender.learn_from(newest.pods())
        self.ledger.finish()
        return listed, node_rv, pod_rv, learned

    def stop(self) -> None:
        self._ready.clear()
        if getattr(self, "handshake", None) is not None:
            self.handshake.stop()
        if self.extender.quota is not None:
            self.extender.quota.stop()
            self.extender.quota = None
        if self.elector is not None:
            self.elector.stop()
        for sub in self._subs:
            sub.stop()
        self._subs = []
        self.requeue.stop()
        if self.extender.preempting is not None:
            self.extender.preempting.settle()  # evictions under way finish: their holds are written already
        self.extender.gangs.stop()

    def _learn_leases(self) -> None:
        """After the sync, on a thread of its own: the Leases the nodes offer, so that the first bind on each node
        writes its Lease without reading it first (`NodeLocks.learn_leases`); without it, each reads it then."""
        with self.state.lock:
            offers = {n: ref for n, r in self.state.nodes.items() if (ref := lease_ref(r.annotations)) is not None}
        if not offers:
            return
        try:
            learned = self.extender.binder.locks.learn_leases(offers)
        except ClusterError as exc:  # e.g. not allowed to list them: each node's first bind reads its Lease
            log.info("the nodes' lock Leases were not listed (%s): each is read at its node's first bind", exc)
            return
        log.info("learned %d of the %d lock Leases nodes offer", learned, len(offers))

    def _on_node(self, event: WatchEvent) -> None:
        self.extender.precedence.yield_to_decisions()
        if event.type == "DELETED":
            self.state.remove_node(meta(event.object)["name"])
        else:
            self.state.set_node(event.object)
            annotations = meta(event.object).get("annotations") or {}
            if LOCK_ANNOTATION in annotations:
                self._release_if_done(meta(event.object)["name"])
            if self.claims is not None:
                self.claims.node_changed(meta(event.object)["name"])
        self.requeue.capacity_freed(self.state.frees)
        self.extender.binder.notify_node_changed()

    def _on_claim(self, event: WatchEvent) -> None:
        self.extender.precedence.yield_to_decisions()
        assert self.claims is not None
        m = meta(event.object)
        if event.type == "DELETED":
            self.claims.remove_claim(str(m.get("namespace") or "default"), str(m.get("name")))
        else:
            self.claims.set_claim(event.object)
        self.requeue.capacity_freed(self.state.frees)

    def _on_pod(self, event: WatchEvent) -> None:
        self.extender.precedence.yield_to_decisions()
        m = meta(event.object)
        namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
        if self.extender.preempting is not None:
            self.extender.preempting.holds.pod_changed(event.object, deleted=event.type == "DELETED")
        self.extender.binder.observe_pod(event.object, deleted=event.type == "DELETED")
        if event.type == "DELETED":
            self.state.remove_pod(namespace, name)
            self.extender.pending.forget(namespace, name, m.get("resourceVersion"))
            self.extender.gangs.forget(namespace, name)
            self.requeue.placed(namespace, name)
        else:
            self.state.set_pod(event.object)
            self.extender.gangs.observe(event.object)  # before the filter may take the pod as seen (quick path)
            self.extender.pending.pod_seen(namespace, name, str(m.get("uid") or ""), m.get("resourceVersion"))
        self.requeue.capacity_freed(self.state.frees)
        self.extender.binder.notify_node_changed()  # a Lease's holder is done when its pod says so
        self._track_waiting(pod_key(namespace, name), None if event.type == "DELETED" else event.object)
        self.ledger.pod_event(event)
        node = (event.object.get("spec") or {}).get("nodeName") or (m.get("annotations") or {}).get(
            VGPU_NODE_ANNOTATION
        )
        if node:
            self._release_if_done(str(node))

    def _release_if_done(self, node: str) -> None:
        with self.state.lock:
            record = self.state.nodes.get(node)
            lock = self.extender.binder.locks.holder(dict(record.annotations)) if record else None
        if lock is None:
            return
        try:
            if self.extender.binder.lock_holder_done(
                lock, node, allocated=False
            ) and self.extender.binder.locks.release(node, lock.namespace, lock.name):
                log.info("released node %s: lock owner %s/%s no longer needs it", node, lock.namespace, lock.name)
        except ClusterError as exc:
            log.warning("could not release the lock of node %s: %s", node, exc)
