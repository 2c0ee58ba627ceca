"""The scheduler extender's filter: rank the candidate nodes, fit the pod onto them, commit the decision.

Filter reads the pod's requests through the vendors and ranks the named nodes under the node policy
(`hami.scheduler.candidates`, `hami.scheduler.policies`: one module per policy); it then asks each involved vendor
to fit the pod onto them in batches: one hook call per vendor per batch, the first batch with a feasible node wins
and its best node is chosen. Only when nothing fits are all candidates examined, so every rejected node then has
its reason. A vendor whose fits depend on nothing of the moment (`DeviceKind.reusable_fits`) is asked only for
the nodes changed since a pod alike (same spec and annotations) was fitted: the others' fits are kept on the node
until it changes (`NodeRecord.memo`).
A pod asking ``hami.io/numa-alignment: best-effort`` is first fitted as if it asked ``strict`` (each container of
several devices on one NUMA node), and over every node as usual only when no node can take it so
(`Extender._prefer_aligned`): the node policy then chooses among the aligned nodes first.
The decision (the placement, and the pod annotations the chosen node's fits carry) is counted at once
(`ClusterState.commit`), so the next pod cannot double-book. `hami scheduler` writes it with the bind
(`record_at_bind`, `hami.scheduler.pending`): the filter makes no API call (one filter at a time is
kube-scheduler's pace), and the pod gets one write fewer, its placement and `hami.io/bind-phase: allocating` in
the same patch, once the node lock is held and before the Binding, so the node side never sees a bound pod
without its placement (HAMi writes the placement at filter and the phase at bind: two patches, two watch events
in every client watching pods). Otherwise (the simulator, most tests) the placement is written before the filter
answers (`hami.scheduler.placement`). A write that fails undoes the decision, and the answer says why.

Bind (`hami.scheduler.binding`) takes the node lock for the pod, marks `hami.io/bind-phase: allocating` and
creates the Binding; this module only answers it when this replica may not decide.

Beside the filter, in their own modules: preemption's part of it (the pod's own hold set aside before the fit,
victims chosen when nothing fits: `hami.scheduler.preempting`), a gang member's filter (`hami.scheduler.gangs`)
and the prioritize verb (`hami.scheduler.prioritize`); the filter only calls them.

This module decides; `hami.scheduler.server` speaks HTTP, `hami.scheduler.service` wires watches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hami.cluster.port import Cluster, KubeObject, meta, pod_key
from hami.errors import HamiError
from hami.fitting import Selectors
from hami.lifecycle import BIND_PHASE, BIND_TIME
from hami.model import ContainerPlacement, ContainerRequest, NodeFit, Pod, SchedulingPolicy
from hami.numaalign import NUMA_ALIGNMENT_ANNOTATION, NumaAlignment, NumaAlignmentError, parse_numa_alignment
from hami.plugins import VendorPlugins
from hami.quota import QuotaLedger
from hami.scheduler.binding import Binder, BindResult
from hami.scheduler.candidates import Candidates
from hami.scheduler.gangs import Gangs
from hami.scheduler.pending import PendingDecision, PendingDecisions
from hami.scheduler.placement import VGPU_TIME, PlacementWriter
from hami.scheduler.policies import NODE_POLICIES, NodePolicy, ObservedWorkload
from hami.scheduler.policy import policy_for
from hami.scheduler.precedence import Precedence
from hami.scheduler.preempting import Preempting, Preemption
from hami.scheduler.prioritize import Prioritizer
from hami.scheduler.requeue import Requeuer
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import TERMINAL_PHASES, ClusterState, Decision, NodeRecord
from hami.transaction import Transaction

__all__ = ["BIND_PHASE", "BIND_TIME", "BindResult", "Extender", "ExtenderSettings", "FilterResult", "VGPU_TIME"]


@dataclass
class FilterResult:
    """The answer to one filter call."""

    node: str | None = None
    failed: dict[str, str] = field(default_factory=dict)
    error: str = ""
    passthrough: bool = False
    """The pod asks for no device a vendor here serves: every candidate passes unchanged."""
    preemption: Preemption | None = field(default=None, repr=False)
    """Victims chosen and room held for the pod, to evict once the decision's locks are released."""


SYNCING = "this scheduler is still reading the cluster; kube-scheduler will retry the pod"
"""The answer to a filter or bind before the state is built (the process is not ready yet)."""


class Extender:
    """Filter and bind over a `ClusterState` kept current by the service's watches."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        state: ClusterState,
        settings: ExtenderSettings | None = None,
    ) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.state = state
        self.settings = settings or ExtenderSettings()
        self.workload = ObservedWorkload()
        self.candidates = Candidates(state, self.settings)
        """Which nodes a filter fits, in which order (`hami.scheduler.candidates`)."""
        self.pending = PendingDecisions()
        """Decisions awaiting their bind, and the pods the watch delivered (`record_at_bind`)."""
        self.writer = PlacementWriter(cluster, plugins, state)
        self.binder = Binder(cluster, plugins, state, self.settings, self.pending, self.writer)
        """Binds, under the node locks (`hami.scheduler.binding`)."""
        self.quota: QuotaLedger | None = None
        """Namespace quotas re-checked at filter time (shared with the webhook), when configured."""
        self.is_leader: Callable[[], bool] = lambda: True
        """Only the leader decides; a follower answers with an error (kube-scheduler's own leader calls us)."""
        self.synced: Callable[[], bool] = lambda: True
        """The state is built (the service's sync is done): until then every filter and bind answers an error."""
        self.on_filter_result: Callable[[FilterResult], None] = lambda result: None
        self.requeue: Requeuer | None = None
        """Told of each refusal for capacity, so that a pod refused just before capacity freed is retried
        (`hami.scheduler.requeue`; the service sets it)."""
        self.precedence = Precedence()
        """The decisions in progress, which the service's watch handlers wait for (`hami.scheduler.precedence`)."""
        self.preempting: Preempting | None = None
        """Preemption for pods no node fits (`hami.scheduler.preempting`); None: off."""
        self.gangs = Gangs(self)
        """Pods placed all or nothing with their group (`hami.scheduler.gangs`); the service reports pods to it."""
        self.prioritizer = Prioritizer(plugins, state, self.settings, lambda: self.workload.profile())
        """The prioritize verb (`hami.scheduler.prioritize`), planning for the workload this filter learns."""

    def filters_at_once(self, namespace: str, name: str, uid: str) -> bool:
        """Whether a filter of this pod waits on nothing but short locks, so that the server may decide on its
        event loop (`ExtenderApp.quick`): the decision is written with the bind (`record_at_bind`: the filter
        makes no API call), the watch has delivered the pod with this UID (the filter need not wait for it), and
        the state holds no earlier placement of it (which a filter finding no node withdraws through the API)."""
        if not self.settings.record_at_bind or not uid or pod_key(namespace, name) in self.state.pods:
            return False
        if self.gangs.member(namespace, name):
            return False
        return self.pending.seen(namespace, name, uid)

    # ---------------------------------------------------------------------------------- filter

    def filter(
        self, pod_obj: KubeObject, node_names: Sequence[str], nodes: Sequence[KubeObject] | None = None
    ) -> FilterResult:
        """Choose the node and devices for a pod among `node_names`, record the decision, and say why not elsewhere.
        `nodes`: the Node objects of the full-Nodes form; naming one this cluster does not have, the call is an
        autoscaler's simulation (`simulate`)."""
        if not self.is_leader():
            result = FilterResult(error="this scheduler replica is not the leader; another replica decides")
        elif not self.synced():
            result = FilterResult(error=SYNCING)
        elif nodes is not None and any(name not in self.state.nodes for name in node_names):
            result = self.simulate(pod_obj, nodes)  # the requeuer is not told: nothing was decided for the pod
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

    def simulate(self, pod_obj: KubeObject, nodes: Sequence[KubeObject]) -> FilterResult:
        """A filter of nodes the cluster does not have (a cluster autoscaler's template nodes), answered as HAMi
        v2.10's `filterSimulation`: the devices read from the Node objects given alone, none of them in use (no
        pod counted, the handshake not read: HAMi's `buildTransientNodeInfo`), the best node chosen by the same
        fit and policies, and nothing counted, reserved or written. A Node with no device of the pod's kinds is
        refused as any unregistered node is; one that cannot be read is refused saying so."""
        state = ClusterState(self.plugins)
        failed: dict[str, str] = {}
        for node in nodes:
            name = str(meta(node).get("name"))
            try:
                state.set_node(_without(node, state.reader.volatile))
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                failed[name] = f"the Node object given cannot be read: {exc}"
        settings = self.settings.model_copy(update={"record_at_bind": True, "pass_over_nodes_in_flight": False})
        alone = Extender(self.cluster, self.plugins, state, settings)  # its own state and pending: nothing leaves it
        result = alone._decide(Pod.from_api(pod_obj), [n for n in state.nodes if n not in failed])
        result.failed.update(failed)
        return result

    def _filter(self, pod_obj: KubeObject, node_names: Sequence[str]) -> FilterResult:
        pod = Pod.from_api(pod_obj)
        if self.settings.record_at_bind and not self.pending.exists(pod, meta(pod_obj).get("resourceVersion")):
            return FilterResult(
                error=f"pod {pod.namespace}/{pod.name} with UID {pod.uid or '(none)'} is not known to this "
                "scheduler's watch; kube-scheduler will retry the pod"
            )
        with self.precedence:  # the watch handlers wait meanwhile (`hami.scheduler.precedence`)
            gang = self.gangs.filter(pod_obj, pod, node_names)
            if gang is not None:
                node, reason = gang
                return FilterResult(node=node) if node else FilterResult(failed=dict.fromkeys(node_names, reason))
            result = self._decide(pod, node_names)
        if result.preemption is not None and self.preempting is not None:
            self.preempting.submit(result.preemption)  # API calls: on a thread of their own, after the state's lock
        return result

    def place(self, pod: Pod, node_names: Sequence[str]) -> FilterResult:
        """Decide one pod as its filter would, without the checks on the request (a gang's members,
        `hami.scheduler.gangs`)."""
        return self._decide(pod, node_names)

    def _decide(self, pod: Pod, node_names: Sequence[str]) -> FilterResult:
        """Rank the named nodes, fit the pod onto them batch by batch, commit the decision on the chosen one."""
        unwritten = self.pending.take(pod.namespace, pod.name) is not None  # never written: no withdrawal
        try:
            requests = self.plugins.pod_requests(pod)
            policy = policy_for(pod.annotations, self.settings.default_policy())
        except (HamiError, ValueError) as exc:
            return FilterResult(error=f"pod {pod.namespace}/{pod.name}: {exc}")
        if not requests:
            return FilterResult(passthrough=True)
        kinds = sorted(requests)
        selectors = {k: Selectors(self.plugins.kind(k), pod) for k in kinds}
        self._observe(pod, requests, selectors)
        if "fragmentation-aware" in (policy.node, *policy.device):
            policy = policy.model_copy(update={"workload": self.workload.profile()})
        result = FilterResult()
        undo = Transaction()
        with self.state.lock:
            earlier = self.state.pods.get(pod_key(pod.namespace, pod.name))
            if earlier is not None and earlier.bound:
                # The scheduler's own state wins over the body: a bound pod keeps its placement, whatever a
                # request says of its spec.nodeName.
                return FilterResult(error=f"pod {pod.namespace}/{pod.name} is already bound to {earlier.node}")
            withdrawn = earlier is not None and not pod.node_name
            if withdrawn:
                # kube-scheduler filters a pod again only when its earlier decision was not carried out (the bind
                # failed, or this process restarted between filter and bind): that decision no longer holds, and
                # the pod must not be kept off the devices by its own earlier placement.
                self.state.remove_pod(pod.namespace, pod.name)
                if self.quota is not None:
                    self.quota.release(pod.namespace, pod.name)
            held = self.preempting.set_aside(pod) if self.preempting is not None else None
            decision = self._prefer_aligned(pod, requests, kinds, policy, selectors, node_names)
            if decision is None:
                batches = self.candidates.batches(pod, requests, policy, selectors, node_names, result.failed)
                node_policy = NODE_POLICIES[policy.node]
                decision = self._fit_in_batches(pod, requests, kinds, batches, policy, node_policy, result)
            if decision is None:
                if withdrawn and not unwritten:
                    self.writer.withdraw(pod)
                if self.preempting is not None:
                    result.preemption = self.preempting.refused(pod, requests, policy, node_names, held, result.failed)
                return result
            refusal = self._commit(undo, decision)
            if self.preempting is not None:
                self.preempting.placed(pod, held, counted=refusal is None)
            if refusal is not None:
                return FilterResult(failed=dict.fromkeys(node_names, refusal))
        if self.settings.record_at_bind:
            self.pending.put(PendingDecision(decision, undo))
        else:
            error = self.writer.record(undo, decision)
            if error:
                return FilterResult(error=error)
        result.node = decision.node
        return result

    def _prefer_aligned(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        kinds: Sequence[str],
        policy: SchedulingPolicy,
        selectors: Mapping[str, Selectors],
        node_names: Sequence[str],
    ) -> Decision | None:
        """For a pod asking ``hami.io/numa-alignment: best-effort`` with a container of several devices, the decision
        among the nodes where each such container fits on one NUMA node (the pod fitted as if it asked ``strict``);
        None when no node has that, or for any other pod: the filter then decides over every node as usual. The
        caller holds the state's lock."""
        value = pod.annotations.get(NUMA_ALIGNMENT_ANNOTATION)
        if value is None or not any(r is not None and r.count > 1 for per in requests.values() for r in per):
            return None
        try:
            if parse_numa_alignment(value) is not NumaAlignment.BEST_EFFORT:
                return None
        except NumaAlignmentError:
            return None  # the vendors' fits refuse it, saying why
        strict = pod.model_copy(update={"annotations": {**pod.annotations, NUMA_ALIGNMENT_ANNOTATION: "strict"}})
        scratch = FilterResult()  # its refusals are not the pod's: the usual pass says why a node cannot take it
        batches = self.candidates.batches(strict, requests, policy, selectors, node_names, scratch.failed)
        decision = self._fit_in_batches(strict, requests, kinds, batches, policy, NODE_POLICIES[policy.node], scratch)
        return None if decision is None else decision._replace(pod=pod)

    def _fit_in_batches(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        kinds: Sequence[str],
        batches: Iterator[list[NodeRecord]],
        policy: SchedulingPolicy,
        node_policy: NodePolicy,
        result: FilterResult,
    ) -> Decision | None:
        """The chosen node, its placement per kind, and the pod annotations its fits carry (None: no node fits)."""
        reuse: int | None = None  # the memo id of this pod's fits, for kinds whose fits may be reused
        for batch in batches:
            feasible: dict[str, float] = {}
            placements: dict[str, dict[str, tuple[ContainerPlacement, ...]]] = {r.name: {} for r in batch}
            carried: dict[str, dict[str, str]] = {}
            for record in batch:
                for view in record.views.values():
                    view.cpu_free, view.memory_free = record.cpu_free, record.memory_free
            for kind in kinds:
                fitted = [r for r in batch if r.name not in result.failed]
                if not fitted:
                    break
                views = [r.views[kind] for r in fitted]
                if self.plugins.kind(kind).reusable_fits:
                    if reuse is None:
                        reuse = self._fit_id(pod, policy)
                    fits = self._reused_fits(kind, pod, requests[kind], fitted, policy, reuse)
                else:
                    fits = self.plugins.fit_nodes(kind, pod, requests[kind], views, policy)
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
                            carried.setdefault(fit.node, {}).update(fit.pod_annotations)
            feasible = {n: s for n, s in feasible.items() if n not in result.failed}
            if self.settings.pass_over_nodes_in_flight and feasible:
                # where the batch mixes nodes with and without decisions in flight (the deferred ones come last), a
                # node that can bind at once wins, and among busy ones the one fewest binds wait for
                waiting = {r.name: len(r.in_flight) for r in batch if r.name in feasible}
                fewest = min(waiting.values())
                feasible = {n: s for n, s in feasible.items() if waiting[n] == fewest}
            if feasible:
                node = node_policy.choose(batch, feasible)
                return Decision(pod, node, placements[node], carried.get(node, {}))
        return None

    def _fit_id(self, pod: Pod, policy: SchedulingPolicy) -> int:
        """The memo id of what a reusable fit reads of the pod and the policy: everything but who the pod is."""
        spec = pod.model_dump_json(exclude={"name", "uid", "node_name"})
        workload = policy.workload.serial if policy.workload is not None else None
        return self.candidates.ids.memo(
            ("fit", spec, policy.node, policy.device, tuple(sorted(policy.weights.items())), workload)
        )

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
            fresh = self.plugins.fit_nodes(kind, pod, requests, [r.views[kind] for r in missing], policy)
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
        if not self.plugins.implements(kind, "hami_score_nodes"):
            return {}
        ok = [f for f in fits if f.placement is not None]
        return self.plugins.score_nodes(kind, pod, ok, views, policy) or {}  # type: ignore[arg-type]

    def _commit(self, undo: Transaction, decision: Decision) -> str | None:
        """Count the decision (the quota reservation, then the state's `commit`), each step's undo in `undo`; or the
        quota's reason to refuse it (None when counted). The caller holds the state's lock."""
        pod, quota = decision.pod, self.quota
        with undo.part():
            if quota is not None:
                verdict = quota.reserve(pod, decision.allocation)
                if not verdict.fits:
                    return verdict.reason
                undo.add(lambda: quota.release(pod.namespace, pod.name), "the quota reservation")
            undo.add(self.state.commit(decision), "the assumption and the host usage")
        return None

    # ---------------------------------------------------------------------------------- the learned workload

    def _observe(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        selectors: Mapping[str, Selectors] | None = None,
    ) -> None:
        if selectors is None:
            selectors = {k: Selectors(self.plugins.kind(k), pod) for k in requests}
        models = {k: tuple(s.use_type) for k, s in selectors.items()}
        self.workload.observe(requests, pod.cpu_request, pod.memory_request, models)

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
                requests = self.plugins.pod_requests(pod)
            except (HamiError, ValueError):
                continue  # the filter reports such pods when they are scheduled; here they only teach nothing
            if requests:
                self._observe(pod, requests)
                counted += 1
        return counted

    # ---------------------------------------------------------------------------------- bind

    def bind(self, namespace: str, name: str, uid: str, node: str) -> BindResult:
        """Bind the pod to `node` under the node lock (`hami.scheduler.binding`), when this replica may decide."""
        if not self.is_leader():
            return BindResult(error="this scheduler replica is not the leader; another replica binds")
        if not self.synced():
            return BindResult(error=SYNCING)
        waiting = self.gangs.may_bind(namespace, name)
        if waiting:
            return BindResult(error=waiting)
        return self.binder.bind(namespace, name, uid, node)


def _without(node: KubeObject, annotations: frozenset[str]) -> KubeObject:
    """`node` less the named annotations (a shallow copy: the object given is left as it is)."""
    m = meta(node)
    kept = {k: v for k, v in (m.get("annotations") or {}).items() if k not in annotations}
    return {**node, "metadata": {**m, "annotations": kept}}
