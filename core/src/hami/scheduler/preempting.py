"""Preempting: when the filter finds no node for a pod, evict the victims `hami.scheduler.preemption` chooses and
hold the room they free for the pod (`hami.scheduler.holds`); in dry-run mode, only say what it would evict.

Why here and not in kube-scheduler (docs/preemption.md): kube-scheduler v1.35's preemption
(`pkg/scheduler/framework/preemption`) dry-runs its own filter plugins on each node the filter refused with every
lower-priority pod removed; with the device slots a node advertises still free, the pod fits there without
anybody leaving, the node yields no candidate, and its extenders' preempt verb is called only on candidates it
found, so an extender can narrow kube-scheduler's choice but never start one. HAMi therefore preempts from its
own filter, and answers the preempt verb with no candidate (`ExtenderApp`), so that kube-scheduler never evicts
pods HAMi did not choose for a pod HAMi preempts for.

Sequence for one preemption, each step's failure stopping the next: (1) under the state's lock, choose the victims
and count the hold at once (so the next filter, of any pod, already sees the room taken); (2) on a thread of its
own (`submit`: the filter answers meanwhile, and never waits on the API server on the HTTP front's loop), write
the hold on the preemptor (`hami.io/preemption-hold`): a restart from here on adopts it instead of choosing again,
so no victim is evicted twice; (3) evict each victim through the Eviction API, with an Event on the
preemptor and one on each victim naming the other. A budget that refuses an eviction (429) ends the preemption:
the hold is dropped and what was already evicted stays evicted (the victims are chosen so that no budget should
refuse). kube-scheduler retries the preemptor as pods go; its filter then sets its hold aside, fits it (into the
held room, once the victims are gone) and drops the hold when it is placed, or counts the hold again and answers
that the pod waits for its victims. A hold expires after `preemption_hold_seconds`.

The filter's side of it is here too: before a pod is fitted its own hold is set aside (`set_aside`), and after, a
placed pod's hold is dropped (`placed`) while a refused one's is counted again or a preemption is chosen for it
(`refused`); the filter only calls these three.

Owns the order of these steps, their Events, log lines and outcome counts; it does not choose victims.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from hami.cluster.port import Cluster, ClusterError, NotFoundError
from hami.model import ContainerRequest, Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami.scheduler.holds import HOLD_ANNOTATION, Hold, HoldBook
from hami.scheduler.preemption import Budget, Choice, VictimSelector, may_preempt
from hami.scheduler.state import ClusterState

__all__ = ["PREEMPTION_RESULTS", "Preempting", "Preemption"]

log = logging.getLogger(__name__)

PREEMPTION_RESULTS = ("evicted", "dry_run", "refused", "failed")
"""`hami_scheduler_preemptions_total{result}`: victims evicted and room held; what would have been evicted (dry
run); an eviction a budget refused; the hold could not be written (the preemptor is gone)."""


@dataclass(frozen=True)
class Preemption:
    """A preemption decided under the state's lock, to carry out after it (`Preempting.carry_out`)."""

    hold: Hold
    choice: Choice
    dry_run: bool


class Preempting:
    """Preemption from the filter: choose and hold under the state's lock, then evict."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        state: ClusterState,
        *,
        hold_seconds: float = 120.0,
        dry_run: bool = False,
    ) -> None:
        self.cluster = cluster
        self.state = state
        self.selector = VictimSelector(plugins, state)
        self.holds = HoldBook(state, hold_seconds)
        self.hold_seconds = hold_seconds
        self.dry_run = dry_run
        self.on_result: Callable[[str, int], None] = lambda result, victims: None
        """Told of each preemption's outcome (one of `PREEMPTION_RESULTS`) and how many pods it evicted."""
        self._dry_runs: dict[str, tuple[str, ...]] = {}
        """Preemptor key → the victims its last dry run named (each named once, not at every retry)."""
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="preempting")
        self._pending: list[Future[str]] = []

    def submit(self, preemption: Preemption) -> Future[str]:
        """Carry out `preemption` on a thread of its own (`carry_out`): the filter answers meanwhile (it may run on
        the HTTP front's event loop), its room already held."""
        future = self._worker.submit(self.carry_out, preemption)
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(future)
        return future

    def settle(self, timeout: float = 30.0) -> None:
        """Wait until every submitted preemption has been carried out (tests, shutdown)."""
        with self._lock:
            pending = list(self._pending)
        wait(pending, timeout)

    def stop(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=False)

    def budgets(self) -> list[Budget]:
        """The cluster's PodDisruptionBudgets (listed when a preemption is considered: rare, and never stale)."""
        try:
            items, _ = self.cluster.list("poddisruptionbudgets")
        except ClusterError as exc:
            log.warning("cannot list PodDisruptionBudgets (%s): the Eviction API alone will enforce them", exc)
            return []
        return [Budget.from_api(b) for b in items]

    # ------------------------------------------------------------------------------ under the state's lock

    def waiting(self, pod: Pod) -> str | None:
        """Why the pod waits, when it holds room while its victims leave (None: it holds none)."""
        hold = self.holds.get(pod.namespace, pod.name)
        if hold is None or hold.uid != pod.uid:
            return None
        left = [k for k, _ in hold.victims if k in self.state.pods]
        return (
            f"preempting: {len(left)} of {len(hold.victims)} evicted pods still hold node {hold.node}'s devices; "
            f"the room is held for this pod for {max(0, round(hold.until - time.time()))} s more"
        )

    def set_aside(self, pod: Pod) -> Hold | None:
        """Before a filter of `pod` fits it: drop the holds past their time (their room is free for it already),
        and stop counting the pod's own hold, so that it fits into the room held for it (`placed` ends it)."""
        self.holds.expire()
        return self.holds.set_aside(pod.namespace, pod.name)

    def placed(self, pod: Pod, held: Hold | None, counted: bool) -> None:
        """The filter of `pod` chose a node: `counted`, the decision is counted and the room `held` for it is its
        own now (the hold is dropped); not counted (the quota refused it), the hold is counted again."""
        if held is None:
            return
        if counted:
            self.holds.drop(pod.namespace, pod.name)
        else:
            self.holds.restore(held)

    def refused(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        policy: SchedulingPolicy,
        node_names: Sequence[str],
        held: Hold | None,
        failed: dict[str, str],
    ) -> Preemption | None:
        """No node fits `pod`: count its hold again while its victims leave, or preempt for it (`decide`); the
        refusal of the node concerned in `failed` says so. Returns the preemption to carry out (`submit`), if any."""
        if held is not None:
            self.holds.restore(held)
            waiting = self.waiting(pod)
            if waiting and held.node in failed:
                failed[held.node] = waiting
            return None
        preemption = self.decide(pod, requests, policy, node_names)
        if preemption is not None:
            node, victims = preemption.hold.node, len(preemption.hold.victims)
            verb = "would evict (dry run)" if preemption.dry_run else "evicting"
            if node in failed:
                failed[node] += f"; preempting: {verb} {victims} lower-priority pod(s) here for this pod"
        return preemption

    def decide(
        self,
        pod: Pod,
        requests: Mapping[str, Sequence[ContainerRequest | None]],
        policy: SchedulingPolicy,
        node_names: Sequence[str],
    ) -> Preemption | None:
        """For a pod no node fits: the victims to evict and the room held for it (counted at once), or None."""
        if may_preempt(pod) is not None or self.holds.get(pod.namespace, pod.name) is not None:
            return None
        self.holds.expire()
        leaving = frozenset(k for h in self.holds.holds.values() for k, _ in h.victims)
        exclude = self.holds.keys() | leaving
        choice = self.selector.select(pod, requests, policy, node_names, exclude=exclude)
        if choice is not None:  # some preemption would do: now (only now) read the budgets, and choose under them
            budgets = self.budgets()
            if budgets:
                choice = self.selector.select(pod, requests, policy, node_names, budgets, exclude=exclude)
        if choice is None or not choice.victims:
            return None
        hold = Hold(
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            node=choice.node,
            priority=pod.priority,
            until=time.time() + self.hold_seconds,
            victims=tuple((v.key, v.uid) for v in choice.victims),
            allocation=dict(choice.allocation),
            init_containers=len(pod.init_containers),
        )
        if not self.dry_run:
            self.holds.put(hold)
        return Preemption(hold, choice, self.dry_run)

    # ------------------------------------------------------------------------------ after it

    def carry_out(self, preemption: Preemption) -> str:
        """Write the hold, then evict (or, dry run, only report); returns the outcome (`PREEMPTION_RESULTS`)."""
        hold = preemption.hold
        names = ", ".join(k for k, _ in hold.victims)
        preemptor = _pod_ref(hold.namespace, hold.name, hold.uid)
        if preemption.dry_run:
            with self._lock:
                if self._dry_runs.get(hold.key) == tuple(k for k, _ in hold.victims):
                    return "dry_run"
                self._dry_runs[hold.key] = tuple(k for k, _ in hold.victims)
            message = f"dry run: would evict {names} on node {hold.node} for this pod (priority {hold.priority})"
            log.info("pod %s: %s", hold.key, message)
            self.cluster.record_event(preemptor, "PreemptionDryRun", message)
            self.on_result("dry_run", 0)
            return "dry_run"
        try:
            self.cluster.patch_metadata(
                "pods", hold.name, hold.namespace, annotations={HOLD_ANNOTATION: hold.annotation()}
            )
        except ClusterError as exc:
            log.warning("pod %s: cannot record its hold (%s); evicting nobody", hold.key, exc)
            self.holds.drop(hold.namespace, hold.name)
            self.on_result("failed", 0)
            return "failed"
        self.cluster.record_event(
            preemptor,
            "Preempting",
            f"evicting {names} (lower priority) on node {hold.node} to make room for this pod (priority "
            f"{hold.priority}); the room is held for it for {round(self.hold_seconds)} s",
        )
        evicted = 0
        for key, uid in hold.victims:
            namespace, _, name = key.partition("/")
            victim = _pod_ref(namespace, name, uid)
            try:
                self.cluster.evict(namespace, name, uid)
            except NotFoundError:
                continue  # gone already: its room is free
            except ClusterError as exc:
                log.warning("pod %s: evicting %s was refused (%s); the preemption stops", hold.key, key, exc)
                self.cluster.record_event(
                    preemptor, "PreemptionRefused", f"evicting {key} was refused: {exc}", warning=True
                )
                self.holds.drop(hold.namespace, hold.name)
                self.on_result("refused", evicted)
                return "refused"
            evicted += 1
            self.cluster.record_event(
                victim,
                "Preempted",
                f"evicted by HAMi's scheduler to make room on node {hold.node} for pod {hold.key} "
                f"(priority {hold.priority})",
            )
        log.info("pod %s: evicted %s on node %s; room held until %.0f", hold.key, names, hold.node, hold.until)
        self.on_result("evicted", evicted)
        return "evicted"


def _pod_ref(namespace: str, name: str, uid: str) -> dict[str, object]:
    """A pod as an Event's involved object."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace, "name": name, "uid": uid}}
