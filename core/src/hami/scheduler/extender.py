"""The scheduler extender's decisions: filter (choose the node and the devices) and bind (lock, mark, bind).

Filter reads the pod's requests through the vendors, orders the candidate nodes under the node policy
(`hami.scheduler.policies`: one module per policy), and asks each involved vendor to fit the pod onto them
in batches: one hook call per vendor per batch, the first batch with a feasible node wins and its best node
is chosen. Only when nothing fits are all candidates examined, so every rejected node then has its reason.
A vendor whose fits depend on nothing of the moment (`DeviceKind.reusable_fits`) is asked only for the nodes
changed since a pod alike (same spec and annotations) was fitted: the others' fits are kept on the node until
it changes (`NodeRecord.memo`).
The decision (the placement, and the pod annotations the chosen node's fits carry) is counted at once
(`ClusterState.assume`), so the next pod cannot double-book. `hami scheduler` writes it with the bind
(`record_at_bind`): the filter makes no API call (one filter at a time is kube-scheduler's pace), and the pod gets
one write fewer, its placement and `hami.io/bind-phase: allocating` in the same patch, once the node lock is
held and before the Binding, so the node side never sees a bound pod without its placement (HAMi writes the
placement at filter and the phase at bind: two patches, two watch events in every client watching pods).
Otherwise (the simulator, most tests) the placement is written before the filter answers. A write that fails
undoes the decision, and the answer says why.

Bind takes the node lock for the pod, marks `hami.io/bind-phase: allocating` and creates the Binding; any
failure releases the lock and is reported in the answer; a decision not yet written when a bind fails is
taken back (kube-scheduler filters the pod again).

This module decides; `hami.scheduler.server` speaks HTTP, `hami.scheduler.service` wires watches.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from hami.cluster.locks import NodeBusy, NodeLocks, VendorLock, VendorLockBusy, vendor_locks_of
from hami.cluster.port import Cluster, ClusterError, KubeObject, NotFoundError, meta
from hami.codec import NodeLock, encode_pod_devices
from hami.errors import HamiError
from hami.fitting import Selectors
from hami.lifecycle import BIND_PHASE, BIND_TIME
from hami.model import ContainerPlacement, ContainerRequest, NodeFit, Pod, SchedulingPolicy, host_requests
from hami.plugins import VendorHost
from hami.quota import QuotaLedger
from hami.scheduler.policies import NODE_POLICIES, NodeKey, NodePolicy, ObservedWorkload, PodShape, Shares, node_share
from hami.scheduler.policy import policy_for
from hami.scheduler.precedence import Precedence
from hami.scheduler.ranking import Evaluation, Rankings
from hami.scheduler.requeue import Requeuer
from hami.scheduler.state import (
    TERMINAL_PHASES,
    VGPU_NODE_ANNOTATION,
    ClusterState,
    NodeRecord,
    pod_key,
    revision,
)
from hami.signing import SIGNATURE_ANNOTATION, SignedPlacement
from hami.transaction import Transaction

__all__ = ["BIND_PHASE", "BIND_TIME", "BindResult", "Extender", "ExtenderSettings", "FilterResult", "VGPU_TIME"]

log = logging.getLogger(__name__)

VGPU_TIME = "hami.io/vgpu-time"

T = TypeVar("T")


class ExtenderSettings(BaseModel):
    """How the extender decides; the `scheduler` section of the configuration."""

    model_config = ConfigDict(extra="forbid")

    node_policy: str = Field(default="binpack", pattern="^(binpack|spread|best-fit|fragmentation-aware)$")
    device_policy: tuple[str, ...] | None = Field(
        default=None, description="None: spread under binpack/spread, the node policy's own device choice otherwise"
    )
    batch_size: int = Field(default=16, ge=1, description="nodes fitted per vendor call before stopping early")
    lock_expiry_seconds: float = Field(default=300, gt=0)
    bind_lock_wait_seconds: float = Field(default=5, ge=0)
    handshake_interval_seconds: float = Field(
        default=30, ge=0, description="seconds between handshake rounds with the node daemons; 0 disables them"
    )
    dra_driver: str | None = Field(
        default=None, description="the DRA driver whose allocated ResourceClaims count as usage (hami.scheduler.claims)"
    )
    pass_over_nodes_in_flight: bool = Field(
        default=False,
        description="read a node whose earlier decision still awaits its Allocate after every other candidate, "
        "fewest waiting first (`hami scheduler` does): its bind would wait for that node lock, so consecutive pods "
        "of a burst spread over nodes that can bind at once; False: the policy's order alone (the simulator, which "
        "never allocates)",
    )
    record_at_bind: bool = Field(
        default=False,
        description="write each decision's annotations with the bind's own patch of the pod, after the node lock "
        "(`hami scheduler` does): no API call on the filter's path and one write per pod fewer; False: before the "
        "filter answers",
    )

    def default_policy(self) -> SchedulingPolicy:
        device = self.device_policy
        if device is None:
            device = ("spread",) if self.node_policy in ("binpack", "spread") else (self.node_policy,)
        return SchedulingPolicy(node=self.node_policy, device=device)


@dataclass
class FilterResult:
    """The answer to one filter call."""

    node: str | None = None
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""
    passthrough: bool = False
    """The pod asks for no device a vendor here serves: every candidate passes unchanged."""


@dataclass(frozen=True)
class _Decision:
    """A filter's decision not yet written (`record_at_bind`): what its bind writes, and how to take it back."""

    pod: Pod
    node: str
    allocation: Mapping[str, tuple[ContainerPlacement, ...]]
    written: Mapping[str, str]
    undo: Transaction
    """Takes back the assumption, the host usage and the quota reservation."""


@dataclass
class BindResult:
    error: str = ""
    lock_wait: float = 0.0
    written: bool = False
    """The pod's placement was written (so a failure after it leaves the decision standing)."""


def _batches(candidates: list[tuple[float, str, NodeRecord]], size: int, first: int) -> Iterator[list[NodeRecord]]:
    """Candidates in order of (key, name): `first` of them, then `size` at a time. The first batch costs O(n)
    (most pods stop there); the full sort is paid only when it holds no feasible node."""
    head = heapq.nsmallest(first, candidates)
    yield [c[2] for c in head]
    if len(candidates) <= first:
        return
    taken = {c[1] for c in head}
    rest = sorted(c for c in candidates if c[1] not in taken)
    for start in range(0, len(rest), size):
        yield [c[2] for c in rest[start : start + size]]


def _in_flight_last(
    ordered: Iterator[tuple[float, str]], nodes: Mapping[str, NodeRecord]
) -> Iterator[tuple[float, str]]:
    """The candidates in their order, but those with decisions awaiting their Allocate after all the others,
    fewest pods waiting first (`_by_queue`). Reading stops at the first batch with a feasible node, so the
    deferred ones cost nothing unless no other node fits."""
    later: list[tuple[float, str]] = []
    for candidate in ordered:
        if nodes[candidate[1]].in_flight:
            later.append(candidate)
        else:
            yield candidate
    later.sort(key=lambda c: len(nodes[c[1]].in_flight))  # stable: the policy's order among equals
    yield from later


def _by_queue(waiting: list[tuple[float, str, NodeRecord]], size: int, first: int) -> Iterator[list[NodeRecord]]:
    """Candidates with decisions in flight, fewest pods awaiting their Allocate first, then in order of (key,
    name). When every node has some (the filter outruns the binds), the policy's first node would otherwise collect
    the whole queue, and its binds, which take its lock one at a time, would wait for each other while the other
    nodes idle."""
    ordered = sorted(waiting, key=lambda c: (len(c[2].in_flight), c[0], c[1]))
    take, start = first, 0
    while start < len(ordered):
        yield [c[2] for c in ordered[start : start + take]]
        start, take = start + take, size


def _ordered_batches(
    ordered: Iterator[tuple[float, str]], nodes: Mapping[str, NodeRecord], size: int, first: int
) -> Iterator[list[NodeRecord]]:
    """Candidates already in order (a ranking's): `first` of them, then `size` at a time."""
    take = first
    while batch := [nodes[name] for _, name in itertools.islice(ordered, take)]:
        yield batch
        take = size


def _memoised(record: NodeRecord, key: Hashable, compute: Callable[[NodeRecord], T]) -> T:
    """What `compute` makes of the node under `key` (its evaluation for a shape, its class for a policy), computed
    once until its usage changes: the state clears `NodeRecord.memo` then (`NodeRecord.remember` bounds it)."""
    hit: T | None = record.memo.get(key)  # type: ignore[assignment]
    if hit is None:
        hit = compute(record)
        record.remember(key, hit)
    return hit


def _shortfall(request: ContainerRequest, kind: str, enough: int, total: int) -> str:
    """Why a node cannot serve `request`, in the words of the request."""
    many = f"{request.count} {kind} devices" if request.count > 1 else f"1 {kind} device"
    if request.memory_percentage is not None:
        memory = "a whole device" if request.memory_percentage >= 100 else f"{request.memory_percentage}% memory"
    else:
        memory = f"{request.memory} MiB"
    if (request.memory_percentage == 100 and request.cores >= 100) or request.cores == 0:
        wants = memory
    else:
        wants = f"{memory} and {request.cores}% cores"
    return f"needs {many} with {wants} free, {enough}/{total} of its devices have it"


def _size(request: ContainerRequest) -> tuple[int, int, int, int]:
    return (request.count, request.memory_percentage or 0, request.memory, request.cores)


WATCH_LAG_SECONDS = 2.0
"""How long a filter waits for the watch to deliver a pod it has not seen yet (`record_at_bind`)."""

SYNCING = "this scheduler is still reading the cluster; kube-scheduler will retry the pod"
"""The answer to a filter or bind before the state is built (the process is not ready yet)."""

UNSELECTED_LAST = 1e15
"""Added to the order key of a node whose device model the pod's type selector refuses, so that batches try the
nodes of the selected models first (the vendor's fit still decides; this only orders)."""


class Extender:
    """Filter and bind over a `ClusterState` kept current by the service's watches."""

    def __init__(
        self,
        cluster: Cluster,
        host: VendorHost,
        state: ClusterState,
        settings: ExtenderSettings | None = None,
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.state = state
        self.settings = settings or ExtenderSettings()
        self.workload = ObservedWorkload()
        self._memo_ids: dict[tuple[object, ...], int] = {}
        self._class_ids: dict[tuple[object, ...], int] = {}
        self.rankings = Rankings(state)
        """Per pod shape (memo id), the named nodes evaluated and ordered (`hami.scheduler.ranking`)."""
        self._memo_counter = itertools.count()
        self.quota: QuotaLedger | None = None
        """Namespace quotas re-checked at filter time (shared with the webhook), when configured."""
        self.is_leader: Callable[[], bool] = lambda: True
        """Only the leader decides; a follower answers with an error (kube-scheduler's own leader calls us)."""
        self.synced: Callable[[], bool] = lambda: True
        """The state is built (the service's sync is done): until then every filter and bind answers an error."""
        self.on_filter_result: Callable[[FilterResult], None] = lambda result: None
        self.on_lock_wait: Callable[[float], None] = lambda seconds: None
        self.requeue: Requeuer | None = None
        """Told of each refusal for capacity, so that a pod refused just before capacity freed is retried
        (`hami.scheduler.requeue`; the service sets it)."""
        self.precedence = Precedence()
        """The decisions in progress, which the service's watch handlers wait for (`hami.scheduler.precedence`)."""
        self.node_changed = threading.Condition()
        self.locks = NodeLocks(
            cluster,
            expiry=timedelta(seconds=self.settings.lock_expiry_seconds),
            holder_done=self.lock_holder_done,
            wait_for_node=self._wait_for_node,
            known=self._known_node,
        )
        self._decisions: dict[str, _Decision] = {}
        """pod key → its decision, from the filter until its bind (`record_at_bind`)."""
        self._decisions_lock = threading.Lock()
        self._pods_seen: dict[str, str] = {}
        """pod key → UID of every live pod the service's watch delivered (`record_at_bind`): a decision is kept in
        memory only for a pod that exists, so a body naming a pod that does not leaves nothing behind."""
        self._pods_seen_changed = threading.Condition()
        self._pods_version = 0
        """The newest resourceVersion the pod watch delivered."""

    def _known_node(self, node: str) -> tuple[Mapping[str, str], str] | None:
        with self.state.lock:
            record = self.state.nodes.get(node)
            return (record.annotations, record.resource_version) if record is not None else None

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

    def _exists(self, pod: Pod, version: object) -> bool:
        """The pod of a filter body is one the watch delivered: with `record_at_bind` its decision lives in memory
        until its bind. A watch behind the body's resourceVersion is waited for (briefly); a pod the watch has
        passed without delivering, or a body without a resourceVersion, does not exist here."""
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

    def filters_at_once(self, namespace: str, name: str, uid: str) -> bool:
        """Whether a filter of this pod waits on nothing but short locks, so that the server may decide on its
        event loop (`ExtenderApp.quick`): the decision is written with the bind (`record_at_bind`: the filter
        makes no API call), the watch has delivered the pod with this UID (the filter need not wait for it), and
        the state holds no earlier placement of it (which a filter finding no node withdraws through the API)."""
        key = pod_key(namespace, name)
        if not self.settings.record_at_bind or not uid or key in self.state.pods:
            return False
        with self._pods_seen_changed:
            return self._pods_seen.get(key) == uid

    def _wait_for_node(self, node: str, seconds: float) -> None:
        with self.node_changed:
            self.node_changed.wait(seconds)

    def notify_node_changed(self) -> None:
        """Wake binds waiting for a node lock (called by the service on node watch events)."""
        with self.node_changed:
            self.node_changed.notify_all()

    # ---------------------------------------------------------------------------------- filter

    def filter(self, pod_obj: KubeObject, node_names: Sequence[str]) -> FilterResult:
        """Choose the node and devices for a pod among `node_names`, record the decision, and say why not elsewhere."""
        if not self.is_leader():
            result = FilterResult(error="this scheduler replica is not the leader; another replica decides")
        elif not self.synced():
            result = FilterResult(error=SYNCING)
        else:
            started, frees = time.monotonic(), self.state.frees  # read before the decision: never newer than it
            result = self._filter(pod_obj, node_names)
            if self.requeue is not None and (result.node or result.failed) and not result.error:
                m = meta(pod_obj)
                namespace, name = str(m.get("namespace") or "default"), str(m.get("name"))
                if result.node:
                    self.requeue.placed(namespace, name)
                else:
                    self.requeue.refused(namespace, name, frees, started)
        self.on_filter_result(result)
        return result

    def _filter(self, pod_obj: KubeObject, node_names: Sequence[str]) -> FilterResult:
        pod = Pod.from_api(pod_obj)
        if self.settings.record_at_bind and not self._exists(pod, meta(pod_obj).get("resourceVersion")):
            return FilterResult(
                error=f"pod {pod.namespace}/{pod.name} with UID {pod.uid or '(none)'} is not known to this "
                "scheduler's watch; kube-scheduler will retry the pod"
            )
        with self.precedence:  # the watch handlers wait meanwhile (`hami.scheduler.precedence`)
            return self._decide(pod, node_names)

    def _decide(self, pod: Pod, node_names: Sequence[str]) -> FilterResult:
        with self._decisions_lock:  # filtered again: an earlier decision not written is withdrawn below
            unwritten = self._decisions.pop(pod_key(pod.namespace, pod.name), None) is not None
        try:
            requests = self.host.pod_requests(pod)
            policy = policy_for(pod.annotations, self.settings.default_policy())
        except (HamiError, ValueError) as exc:
            return FilterResult(error=f"pod {pod.namespace}/{pod.name}: {exc}")
        if not requests:
            return FilterResult(passthrough=True)
        kinds = sorted(requests)
        selectors = {k: Selectors(self.host.kind(k), pod) for k in kinds}
        self._observe(pod, requests, selectors)
        if "fragmentation-aware" in (policy.node, *policy.device):
            policy = policy.model_copy(update={"workload": self.workload.profile()})
        result = FilterResult()
        withdrawn = False
        undo = Transaction()
        with self.state.lock:
            earlier = self.state.pods.get(pod_key(pod.namespace, pod.name))
            if earlier is not None and earlier.bound:
                # The scheduler's own state wins over the body: a bound pod keeps its placement, whatever a
                # request says of its spec.nodeName.
                return FilterResult(error=f"pod {pod.namespace}/{pod.name} is already bound to {earlier.node}")
            if earlier is not None and not pod.node_name:
                # kube-scheduler filters a pod again only when its earlier decision was not carried out (the bind
                # failed, or this process restarted between filter and bind): that decision no longer holds, and
                # the pod must not be kept off the devices by its own earlier placement.
                self.state.remove_pod(pod.namespace, pod.name)
                if self.quota is not None:
                    self.quota.release(pod.namespace, pod.name)
                withdrawn = True
            candidates: list[tuple[float, str, NodeRecord]] = []
            largest = {k: max((r for r in requests[k] if r is not None), key=_size) for k in kinds}
            shares = Shares(largest)
            host = (pod.host_cpu, pod.host_memory)
            node_policy = NODE_POLICIES[policy.node]
            shape = PodShape(tuple(kinds), largest, shares, host, policy.workload)
            order = node_policy.order(self.state, shape)
            adjust = self._adjustment(node_policy, shape, selectors)
            nodes = self.state.nodes
            signature = self.state.signature
            single = kinds[0] if len(kinds) == 1 else None
            memo_key = self._memo_id(
                (
                    policy.node,
                    policy.workload.serial if policy.workload is not None else None,
                    host,
                    tuple((k, r.count, r.memory, r.memory_percentage, r.cores) for k, r in sorted(largest.items())),
                )
            )

            def evaluate(record: NodeRecord) -> tuple[str | None, float]:
                # A cheap necessary condition on the node's free shares spares the vendor call for hopeless
                # nodes; the reason stays exact about what is missing.
                for kind, request in largest.items():
                    free = signature(record, kind)
                    share = shares(record, kind)
                    if len(free) < request.count or free[-request.count] < share:
                        enough = sum(1 for f in free if f >= share)
                        return _shortfall(request, kind, enough, len(record.views[kind].devices)), 0.0
                return None, order(record)

            node_of = nodes.get
            size = self.settings.batch_size
            # A policy that takes the first feasible node in its order needs no more than that node fitted, and the
            # first candidate nearly always fits (it passed the free-share check); others compare a batch's scores.
            first = 1 if node_policy.takes_first_feasible else size
            batches: Iterator[list[NodeRecord]]
            if single is not None:
                # One kind: the shape's ranking, brought up to date with the nodes changed since its last filter.
                kind_of = single
                classify = node_policy.order_class(self.state, shape)
                alike: dict[Hashable, Evaluation] = {}  # node class → evaluation, this filter
                class_key = self._memo_id(("class", node_policy.name, kind_of))  # where a node's class is memoised
                class_id = self._class_id

                def evaluate_node(name: str) -> Evaluation:
                    record = node_of(name)
                    if record is None or kind_of not in record.totals:
                        return self._unregistered(record, kinds), 0.0, 0
                    if classify is None:
                        hit = _memoised(record, memo_key, evaluate)
                        return hit[0], hit[1], record.totals[kind_of].group
                    # A class is evaluated once per filter (`alike`, whose evaluations the ranking keeps as they
                    # are); the ranking's rebuild (a new shape or workload profile) asks one node per class.
                    cls = node_class(name)
                    found = alike.get(cls)
                    if found is None:
                        reason, key = evaluate(record)
                        found = alike[cls] = (reason, key, record.totals[kind_of].group)
                    return found

                def node_class(name: str) -> Hashable:
                    """What `evaluate` reads of the node: its free shares, device size and count, the policy's part;
                    and the group its evaluation carries. As a small integer, memoised on the node until its usage
                    changes; a node without the kind is a class of its own (its name)."""
                    record = node_of(name)
                    if record is None or kind_of not in record.totals:
                        return name
                    return _memoised(record, class_key, class_of)

                def class_of(record: NodeRecord) -> int:
                    assert classify is not None
                    totals = record.totals[kind_of]
                    devices = len(record.views[kind_of].devices)
                    return class_id(
                        (signature(record, kind_of), totals.largest, devices, totals.group, classify(record))
                    )

                partition = None if classify is None else (class_key, node_class)
                ranking = self.rankings.current(memo_key, evaluate_node, partition)
                ranked, reasons = ranking.ranked, ranking.failed
                unknown = self._unregistered(None, kinds)
                result.failed.update({n: reasons.get(n) or unknown for n in node_names if n not in ranked})
                adjustments: dict[int, float] = {}
                if adjust is not None:
                    adjustments = {g: adjust(nodes[n]) for g, n in ranking.representatives().items()}
                named = node_names if isinstance(node_names, (set, frozenset)) else set(node_names)
                ordered = ranking.ordered(adjustments, named)
                if self.settings.pass_over_nodes_in_flight:
                    ordered = _in_flight_last(ordered, nodes)
                batches = _ordered_batches(ordered, nodes, size, first)
            else:
                failed, append = result.failed, candidates.append  # this loop runs once per node
                for name in node_names:
                    record = node_of(name)
                    if record is None or any(k not in record.totals for k in kinds):
                        failed[name] = self._unregistered(record, kinds)
                        continue
                    reason, key = _memoised(record, memo_key, evaluate)
                    if reason is not None:
                        failed[name] = reason
                        continue
                    if adjust is not None:
                        key += adjust(record)
                    append((key, name, record))
                if self.settings.pass_over_nodes_in_flight and any(c[2].in_flight for c in candidates):
                    later = [c for c in candidates if c[2].in_flight]
                    now = [c for c in candidates if not c[2].in_flight]
                    batches = itertools.chain(_batches(now, size, first) if now else (), _by_queue(later, size, first))
                else:
                    batches = _batches(candidates, size, first)
            best = self._fit_in_batches(pod, requests, kinds, batches, policy, node_policy, result)
            if best is None:
                if withdrawn and not unwritten:
                    self._withdraw_decision(pod)
                return result
            node, allocation, written = best
            pod_id = pod_key(pod.namespace, pod.name)
            quota = self.quota
            with undo.part():
                if quota is not None:
                    verdict = quota.reserve(pod, allocation, len(pod.init_containers))
                    if not verdict.fits:
                        return FilterResult(failed=dict.fromkeys(node_names, verdict.reason))
                    undo.add(lambda: quota.release(pod.namespace, pod.name), "the quota reservation")
                undo.add(lambda: self.state.remove_pod(pod.namespace, pod.name), "the assumption")
                undo.add(lambda: self.state.set_host_usage(pod_id, "", 0, 0), "the host usage")
                self.state.assume(pod.namespace, pod.name, pod.uid, node, len(pod.init_containers), allocation, written)
                self.state.set_host_usage(pod_id, node, *host)
        if self.settings.record_at_bind:
            with self._decisions_lock:
                self._decisions[pod_id] = _Decision(pod, node, allocation, written, undo)
        else:
            error = self._record(undo, pod, node, allocation, written)
            if error:
                return FilterResult(error=error)
        result.node = node
        return result

    def _record(
        self,
        undo: Transaction,
        pod: Pod,
        node: str,
        allocation: Mapping[str, tuple[ContainerPlacement, ...]],
        written: Mapping[str, str],
    ) -> str:
        """Write the decision; on any failure take back what the filter did (`undo`: the assumption, the quota
        reservation) and say why ("" when written)."""
        try:
            with undo:
                self._record_decision(pod, node, allocation, written)
        except ClusterError as exc:
            return f"could not record the placement of {pod.namespace}/{pod.name} on {node}: {exc}"
        except Exception as exc:  # the writer thread must answer every bind, whatever failed
            log.exception("recording the placement of %s/%s failed", pod.namespace, pod.name)
            return f"could not record the placement of {pod.namespace}/{pod.name} on {node}: {exc}"
        return ""

    def _observe(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        selectors: Mapping[str, Selectors] | None = None,
    ) -> None:
        if selectors is None:
            selectors = {k: Selectors(self.host.kind(k), pod) for k in requests}
        models = {k: tuple(s.use_type) for k, s in selectors.items()}
        self.workload.observe(requests, pod.host_cpu, pod.host_memory, models)

    def learn_from(self, pods: Iterable[KubeObject]) -> int:
        """Seed the learned workload with the device requests of live pods, newest last (at start-up, so that a
        restarted scheduler plans for the cluster's mix at once rather than for its first requests). Returns how
        many pods were counted."""
        live = [p for p in pods if (p.get("status") or {}).get("phase") not in TERMINAL_PHASES]
        live.sort(key=lambda p: str(meta(p).get("creationTimestamp") or ""))
        counted = 0
        for obj in live[-self.workload.window :]:
            try:
                pod = Pod.from_api(obj)
                requests = self.host.pod_requests(pod)
            except (HamiError, ValueError):
                continue  # the filter reports such pods when they are scheduled; here they only teach nothing
            if requests:
                self._observe(pod, requests)
                counted += 1
        return counted

    def _memo_id(self, key: tuple[object, ...]) -> int:
        """A small integer standing for a per-node memo key (hashed once per filter, not once per node); never
        reused, so that forgetting old keys cannot make a node's stale evaluation look current."""
        return self._small_id(self._memo_ids, key, 4096)

    def _class_id(self, node_class: tuple[object, ...]) -> int:
        """A small integer standing for a node class (what a policy's order reads of a node, `NodePolicy.order_class`),
        never reused, as `_memo_id`'s."""
        return self._small_id(self._class_ids, node_class, 65536)

    def _small_id(self, ids: dict[tuple[object, ...], int], key: tuple[object, ...], kept: int) -> int:
        """`key`'s number in `ids` (at most `kept` of them, then forgotten), drawn from one counter: never reused."""
        found = ids.get(key)
        if found is None:
            if len(ids) > kept:
                ids.clear()
            found = ids[key] = next(self._memo_counter)
        return found

    def _unregistered(self, record: NodeRecord | None, kinds: Sequence[str]) -> str:
        """Why a node has none of the pod's device kinds to offer."""
        missing = [k for k in kinds if record is None or k not in record.views]
        dropped = [k for k in missing if record is not None and k in record.dropped]
        if dropped:
            return f"{', '.join(dropped)} devices dropped: the node daemon stopped answering the handshake"
        return f"no {', '.join(missing)} devices registered"

    def _adjustment(
        self, node_policy: NodePolicy, shape: PodShape, selectors: Mapping[str, Selectors]
    ) -> NodeKey | None:
        """What a node's memoised order key leaves out, because it depends on other nodes (the policy's
        `NodePolicy.adjustment`) or on the pod's type selectors (nodes of models it does not select go last).
        None when nothing applies. The caller computes it once per node group (model and device size) for
        single-kind pods."""
        scarcity = node_policy.adjustment(self.state, shape)
        typed = [(k, s) for k, s in selectors.items() if s.use_type or s.nouse_type]
        if scarcity is None and not typed:
            return None

        def adjustment(record: NodeRecord) -> float:
            value = scarcity(record) if scarcity else 0.0
            if any(s.refuses_model(record.totals[k].model) for k, s in typed):
                value += UNSELECTED_LAST  # the fit will refuse it: try the nodes of selected models first
            return value

        return adjustment

    def _fit_in_batches(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        kinds: Sequence[str],
        batches: Iterator[list[NodeRecord]],
        policy: SchedulingPolicy,
        node_policy: NodePolicy,
        result: FilterResult,
    ) -> tuple[str, dict[str, tuple[ContainerPlacement, ...]], dict[str, str]] | None:
        """The chosen node, its placement per kind, and the pod annotations its fits carry."""
        reuse: int | None = None  # the memo id of this pod's fits, for kinds whose fits may be reused
        for batch in batches:
            feasible: dict[str, float] = {}
            placements: dict[str, dict[str, tuple[ContainerPlacement, ...]]] = {r.name: {} for r in batch}
            written: dict[str, dict[str, str]] = {}
            for record in batch:
                for view in record.views.values():
                    view.cpu_free, view.memory_free = record.cpu_free, record.memory_free
            for kind in kinds:
                fitted = [r for r in batch if r.name not in result.failed]
                if not fitted:
                    break
                views = [r.views[kind] for r in fitted]
                if self.host.kind(kind).reusable_fits:
                    if reuse is None:
                        reuse = self._fit_id(pod, policy)
                    fits = self._reused_fits(kind, pod, requests[kind], fitted, policy, reuse)
                else:
                    fits = self.host.fit_nodes(kind, pod, requests[kind], views, policy)
                scores = self._scores(kind, pod, fits, {v.name: v for v in views}, policy)
                for fit in fits:
                    if fit.placement is None:
                        prefix = f"{kind}: " if len(kinds) > 1 else ""
                        result.failed[fit.node] = prefix + fit.reason
                        feasible.pop(fit.node, None)
                    else:
                        placements[fit.node][kind] = fit.placement
                        feasible[fit.node] = feasible.get(fit.node, 0.0) + scores.get(fit.node, fit.score)
                        if fit.pod_annotations:
                            written.setdefault(fit.node, {}).update(fit.pod_annotations)
            feasible = {n: s for n, s in feasible.items() if n not in result.failed}
            if self.settings.pass_over_nodes_in_flight and feasible:
                # where the batch mixes nodes with and without decisions in flight (the deferred ones come last), a
                # node that can bind at once wins, and among busy ones the one fewest binds wait for
                waiting = {r.name: len(r.in_flight) for r in batch if r.name in feasible}
                fewest = min(waiting.values())
                feasible = {n: s for n, s in feasible.items() if waiting[n] == fewest}
            if feasible:
                node = node_policy.choose(batch, feasible)
                return node, placements[node], written.get(node, {})
        return None

    def _fit_id(self, pod: Pod, policy: SchedulingPolicy) -> int:
        """The memo id of what a reusable fit reads of the pod and the policy: everything but who the pod is."""
        spec = pod.model_dump_json(exclude={"name", "uid", "node_name"})
        workload = policy.workload.serial if policy.workload is not None else None
        return self._memo_id(("fit", spec, policy.node, policy.device, tuple(sorted(policy.weights.items())), workload))

    def _reused_fits(
        self,
        kind: str,
        pod: Pod,
        requests: list[ContainerRequest | None],
        records: Sequence[NodeRecord],
        policy: SchedulingPolicy,
        reuse: int,
    ) -> list[NodeFit]:
        """The vendor's fits of `records` for a kind that declares them reusable (`DeviceKind.reusable_fits`):
        those memoised for a pod alike since the node last changed (the state clears `NodeRecord.memo` then),
        the others from one hook call, memoised in turn. The first pod of a shape pays for the batch; the next
        ones for the node the previous one took."""
        slot = (reuse, kind)
        fits: list[NodeFit] = []
        missing: list[NodeRecord] = []
        for record in records:
            hit = record.memo.get(slot)
            if isinstance(hit, NodeFit):
                fits.append(hit)
            else:
                missing.append(record)
        if missing:
            fresh = self.host.fit_nodes(kind, pod, requests, [r.views[kind] for r in missing], policy)
            by_name = {r.name: r for r in missing}
            for fit in fresh:
                owner = by_name.get(fit.node)
                if owner is not None:
                    owner.remember(slot, fit)
            fits.extend(fresh)
        return fits

    def _scores(
        self, kind: str, pod: Pod, fits: Sequence[NodeFit], views: Mapping[str, object], policy: SchedulingPolicy
    ) -> Mapping[str, float]:
        if not self.host.implements(kind, "hami_score_nodes"):
            return {}
        ok = [f for f in fits if f.placement is not None]
        return self.host.score_nodes(kind, pod, ok, views, policy) or {}  # type: ignore[arg-type]

    def _record_decision(
        self,
        pod: Pod,
        node: str,
        allocation: Mapping[str, tuple[ContainerPlacement, ...]],
        pod_annotations: Mapping[str, str] | None = None,
        *,
        also: Mapping[str, str] | None = None,
    ) -> None:
        """Write the placement and the vendors' pod annotations (`NodeFit.pod_annotations`); on a clash of
        keys, the placement's own annotations win. With placement keys, the same write signs the placement
        (`hami.signing`): the allocated annotations and the vendors' ones, for this pod's UID on `node`. `also`:
        annotations written in the same patch but not signed (the bind phase, with `record_at_bind`)."""
        annotations: dict[str, str | None] = dict(pod_annotations or {})
        annotations.update(also or {})
        annotations.update({VGPU_NODE_ANNOTATION: node, VGPU_TIME: str(int(time.time()))})
        signed: dict[str, str] = {k: v for k, v in (pod_annotations or {}).items() if v is not None}
        for kind, placements in allocation.items():
            keys = self.host.kind(kind).annotations
            value = encode_pod_devices(placements)
            if keys.to_allocate is not None:
                annotations[keys.to_allocate] = value
            annotations[keys.allocated] = value
            signed[keys.allocated] = value
        signer = self.state.signer
        if signer is not None:
            annotations[SIGNATURE_ANNOTATION] = signer.sign(SignedPlacement(pod.uid, node, signed))
        patched = self.cluster.patch_metadata(
            "pods", pod.name, pod.namespace, annotations=annotations, labels={VGPU_NODE_ANNOTATION: node}
        )
        self.state.written(pod.namespace, pod.name, pod.uid, meta(patched).get("resourceVersion"))

    def _withdraw_decision(self, pod: Pod) -> None:
        """Remove an abandoned placement from the pod, so that the watch does not count it again (best effort)."""
        annotations: dict[str, str | None] = {VGPU_NODE_ANNOTATION: None, VGPU_TIME: None, SIGNATURE_ANNOTATION: None}
        for kind in self.host.kinds:
            if kind.annotations.to_allocate is not None:
                annotations[kind.annotations.to_allocate] = None
            annotations[kind.annotations.allocated] = None
        try:
            self.cluster.patch_metadata(
                "pods", pod.name, pod.namespace, annotations=annotations, labels={VGPU_NODE_ANNOTATION: None}
            )
        except ClusterError as exc:
            log.warning("could not withdraw the abandoned placement of %s/%s: %s", pod.namespace, pod.name, exc)

    def prioritize(self, pod_obj: KubeObject, node_names: Sequence[str]) -> dict[str, int]:
        """Scores 0-10 for clusters that configure prioritize: HAMi's node score under binpack and spread.

        Under the fragmentation-aware policy a pod without devices is scored too (configure the extender
        without managed resources so that kube-scheduler sends every pod): its CPU and memory can strand a
        node's free devices, and the node where they hurt least scores highest."""
        pod = Pod.from_api(pod_obj)
        try:
            kinds = sorted(self.host.pod_requests(pod))
            policy = policy_for(pod.annotations, self.settings.default_policy())
        except (HamiError, ValueError):
            return {}
        if not kinds:
            growth = self.host_only_growth(pod_obj, node_names, policy)
            if not growth:
                return {}
            low, high = min(growth.values()), max(growth.values())
            spread = (high - low) or 1.0
            return {n: round(10 * (high - g) / spread) for n, g in growth.items()}
        scores = {}
        with self.state.lock:
            for name in node_names:
                record = self.state.nodes.get(name)
                if record is None or any(k not in record.views for k in kinds):
                    continue
                share = node_share(record, kinds) / (3 * len(kinds))
                scores[name] = NODE_POLICIES[policy.node].priority(share)
        return scores

    def host_only_growth(
        self, pod_obj: KubeObject, node_names: Sequence[str], policy: SchedulingPolicy | None = None
    ) -> dict[str, float]:
        """For a pod without devices under the fragmentation-aware policy: how much placing its CPU and memory
        on each node grows that node's expected device fragmentation (empty under other policies)."""
        policy = policy or self.settings.default_policy()
        workload = self.workload.profile()
        shape = PodShape((), {}, Shares({}), host_requests(pod_obj.get("spec") or {}), workload)
        with self.state.lock:
            return NODE_POLICIES[policy.node].host_only(self.state, shape, node_names)

    # ---------------------------------------------------------------------------------- bind

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        if not self.is_leader():
            return BindResult(error="this scheduler replica is not the leader; another replica binds")
        if not self.synced():
            return BindResult(error=SYNCING)
        known = self._known_binding(namespace, name, uid, node)
        if known is not None:
            return known
        decision: _Decision | None = None
        if self.settings.record_at_bind:
            with self._decisions_lock:
                decision = self._decisions.pop(pod_key(namespace, name), None)
            if decision is None or decision.node != node:
                # nothing decided here for this pod on that node (another process answered its filter, or none
                # did): binding it would leave the node side without a placement
                if decision is not None:
                    decision.undo.abandon("bound elsewhere than decided")
                return BindResult(
                    error=f"no placement of {namespace}/{name} on {node} is known to this scheduler; "
                    "kube-scheduler will retry the pod"
                )
        result = self._lock_and_bind(namespace, name, uid, node, decision)
        if result.error and decision is not None and not result.written:
            decision.undo.abandon("its bind failed")  # kube-scheduler filters the pod again
        return result

    def _lock_and_bind(self, namespace: str, name: str, uid: str, node: str, decision: _Decision | None) -> BindResult:
        """Lock the node, write the decision (if not yet written) with `bind-phase: allocating`, bind.

        A pod whose every kind is served on the node by the vendor's own device plugin (no to-allocate key: Enflame's
        DRS, AWS Neuron) takes no node lock, as HAMi takes none for them: no node daemon would release it."""
        started = time.monotonic()
        kinds = self._pod_kinds(namespace, name)
        vendor_locks = vendor_locks_of(self.host.kind(k) for k in kinds)
        locking = not kinds or any(self.host.kind(k).annotations.to_allocate is not None for k in kinds)
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
        written = decision is None
        try:
            with Transaction() as undo:
                if locking:
                    undo.add(lambda: self.locks.release(node, namespace, name, vendor_locks), "the node locks")
                if decision is not None:
                    self._record_decision(decision.pod, node, decision.allocation, decision.written, also=phase)
                else:
                    self.cluster.patch_metadata("pods", name, namespace, annotations=phase)
                written = True
                undo.add(lambda: self._mark_bind_failed(namespace, name), "the bind phase")
                self.cluster.bind(namespace, name, uid, node)
        except ClusterError as exc:
            if not written:
                return BindResult(
                    error=f"could not record the placement of {namespace}/{name} on {node}: {exc}; "
                    "kube-scheduler will retry the pod",
                    lock_wait=waited,
                )
            error = f"binding {namespace}/{name} to {node} failed: {exc}"
            return BindResult(error=error, lock_wait=waited, written=True)
        except BaseException:
            if decision is not None and not written:
                decision.undo.abandon("its bind failed")
            raise
        self.state.mark_bound(namespace, name, node)
        return BindResult(lock_wait=waited, written=True)

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
                return BindResult(written=True)
            return BindResult(error=f"pod {namespace}/{name} is already bound to {placed}")
        return None

    def _mark_bind_failed(self, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):  # a pod that is gone has no bind phase to mark
            self.cluster.patch_metadata("pods", name, namespace, annotations={BIND_PHASE: "failed"})

    def _every_vendor_lock(self) -> list[VendorLock]:
        return vendor_locks_of(self.host.kinds)

    def _pod_kinds(self, namespace: str, name: str) -> list[str]:
        """The device kinds the pod was placed with."""
        with self.state.lock:
            record = self.state.pods.get(pod_key(namespace, name))
            kinds = sorted(record.allocation) if record is not None else None
        if kinds is None:  # not seen by this replica's filter (e.g. a restart in between): ask the pod
            try:
                kinds = sorted(self.host.pod_requests(Pod.from_api(self.cluster.get("pods", name, namespace))))
            except (ClusterError, HamiError, ValueError):
                kinds = []
        return kinds

    # ---------------------------------------------------------------------------------- locks

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
