"""Gangs: pods that are useless one by one, placed all or nothing by holding devices for the whole group.

Which gang a pod names, and how many of its members must run together, is read by `hami.scheduler.podgroups`
(the coscheduling plugin's and Volcano's PodGroups, Kueue's pod groups, this project's `hami.io/gang`).

At the first member's filter the devices of the whole gang (`minMember` less the members already bound) are
decided, one member after the other through the filter's own decision (`GangHost.place`), over the nodes
kube-scheduler offered that member: either every member gets a node and the group is held, or nothing is counted
and the member is refused with the reason. A held member's filter finds its node waiting (`claim`); no member
binds until every held member has reached its filter (`may_bind`), so a gang never runs half. Holds not completed
within the timeout (`DEFAULT_TIMEOUT_SECONDS`, or the pod's `hami.io/gang-timeout`) are all released, so two
gangs can never wait on each other: each holds all it needs, or nothing, and not forever. A gang released so holds
nothing for a while (the timeout, doubled with each release in a row, at most `MAX_COOLING_SECONDS`).

A hold is written onto its member pod as an ordinary placement (the `hami.io/vgpu-node` annotations, signed
when placement keys are set) before the filter answers: a restarted scheduler counts it from the pod like any
other placement (nothing double-booked) and takes the gang's holds back from its unbound members that carry
one (`_recover`; nothing lost). Releasing a hold withdraws the placement from the pod.

Bad input never leaves a hold behind: a gang with fewer pods than its `minMember`, a PodGroup that does not exist,
or an unreadable size is waited on with a Warning Event on the pod saying what to fix; a member moving to another
group, or deleted, releases its gang's holds.

Owns the gangs and their holds, and nothing of a single pod's placement (`hami.scheduler.extender` decides each
member, `hami.scheduler.state` counts it, `hami.scheduler.placement` writes it).
Thread-safety: one re-entrant lock, taken before the state's; releases at the deadline run on a timer thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from hami.cluster.port import Cluster, ClusterError, KubeObject, meta, pod_key
from hami.lifecycle import BIND_PHASE, BIND_TIME, TERMINAL_PHASES
from hami.model import Pod
from hami.quota import QuotaLedger
from hami.scheduler.pending import PendingDecision, PendingDecisions
from hami.scheduler.placement import VGPU_TIME, PlacementWriter
from hami.scheduler.podgroups import GangError, GroupRef, group_of, members_needed
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import VGPU_NODE_ANNOTATION, ClusterState, Decision
from hami.signing import SIGNATURE_ANNOTATION
from hami.transaction import Transaction

__all__ = ["MAX_COOLING_SECONDS", "GangHost", "Gangs"]

log = logging.getLogger(__name__)

MAX_COOLING_SECONDS = 600.0
"""The longest a gang whose holds timed out waits before it holds again (the wait doubles with each timeout in a
row, from the gang's timeout), so a gang that cannot complete does not keep devices from others."""


class Placed(Protocol):
    """What the filter answers for one pod (`hami.scheduler.extender.FilterResult`)."""

    node: str | None
    failed: dict[str, str]
    error: str


class GangHost(Protocol):
    """What the gangs need of the filter (`hami.scheduler.extender.Extender`)."""

    cluster: Cluster
    state: ClusterState
    pending: PendingDecisions
    writer: PlacementWriter
    quota: QuotaLedger | None
    settings: ExtenderSettings

    def place(self, pod: Pod, node_names: Sequence[str]) -> Placed: ...


@dataclass
class Hold:
    """Devices decided and counted for a gang's members, awaiting their filters."""

    group: GroupRef
    members: dict[str, PendingDecision]
    """pod key → its decision and how to take it back."""
    deadline: float
    """Wall-clock time after which an incomplete hold is released."""
    claimed: set[str] = field(default_factory=set)
    """Members whose own filter found their node waiting."""

    @property
    def complete(self) -> bool:
        return self.claimed >= set(self.members)


GangAnswer = tuple[str | None, str]
"""A gang member's filter answer: (node, "") placed there; (None, reason) every offered node refused with reason."""


class Gangs:
    """The gangs the pod watch reports, and the holds of those being placed."""

    def __init__(self, host: GangHost, *, clock: Callable[[], float] = time.time) -> None:
        self.host = host
        self.clock = clock
        self._lock = threading.RLock()
        self._members: dict[str, dict[str, KubeObject]] = {}
        """gang key → member pod key → the newest view of the pod."""
        self._group_of: dict[str, str] = {}
        """pod key → its gang key."""
        self._holds: dict[str, Hold] = {}
        """gang key → its hold."""
        self._held: dict[str, str] = {}
        """pod key → the gang key of the hold it is a member of."""
        self._told: set[tuple[str, str]] = set()
        """(pod key, message) of the Events recorded, so that a retried filter does not repeat them."""
        self._timers: list[threading.Timer] = []
        self._cooling: dict[str, tuple[float, int]] = {}
        """gang key → (when it may hold again, how many times in a row its holds timed out)."""

    # ---------------------------------------------------------------------------------- the pod watch

    def observe(self, obj: KubeObject) -> None:
        """The watch delivered a pod (called by the service for every pod event but deletions). A member joining a
        gang may let its waiting members be placed: it counts as a capacity free (`ClusterState.frees`), so that a
        member refused from a view without it is retried (`hami.scheduler.requeue`)."""
        if self._observe(obj):
            with self.host.state.lock:
                self.host.state.frees += 1

    def _observe(self, obj: KubeObject) -> bool:
        """Keep the pod's view; whether it joined a gang."""
        m = meta(obj)
        key = pod_key(str(m.get("namespace") or "default"), str(m.get("name")))
        phase = str((obj.get("status") or {}).get("phase") or "")
        try:
            ref = group_of(obj) if phase not in TERMINAL_PHASES else None
        except GangError:
            ref = None  # its filter says why
        released: list[Hold] = []
        joined = False
        with self._lock:
            before = self._group_of.get(key)
            if before is not None and (ref is None or ref.key != before):
                self._members.get(before, {}).pop(key, None)
                del self._group_of[key]
                released += self._lost_member(key, before, "left the gang" if ref is None else f"moved to {ref.name}")
            if ref is not None:
                joined = self._group_of.get(key) != ref.key
                self._members.setdefault(ref.key, {})[key] = obj
                self._group_of[key] = ref.key
                if (obj.get("spec") or {}).get("nodeName"):
                    self._bound(key)
        self._withdraw(released)
        return joined

    def forget(self, namespace: str, name: str) -> None:
        """The pod was deleted: a gang held for it can no longer complete, and is released."""
        key = pod_key(namespace, name)
        with self._lock:
            group = self._group_of.pop(key, None)
            if group is None:
                return
            self._members.get(group, {}).pop(key, None)
            released = self._lost_member(key, group, "was deleted")
        self._withdraw(released)

    def member(self, namespace: str, name: str) -> bool:
        """Whether the watch reported the pod as a gang member (its filter may call the API: not on the event loop)."""
        with self._lock:
            return pod_key(namespace, name) in self._group_of

    def _lost_member(self, key: str, group: str, what: str) -> list[Hold]:
        hold = self._holds.get(group)
        if hold is None or key not in hold.members or hold.complete:
            return []
        log.info("gang %s: member %s %s; releasing its holds", group, key, what)
        return [self._drop(hold)]

    def _bound(self, key: str) -> None:
        group = self._held.pop(key, None)
        hold = self._holds.get(group or "")
        if hold is not None:
            hold.members.pop(key, None)
            hold.claimed.discard(key)
            if not hold.members:
                del self._holds[hold.group.key]

    # ---------------------------------------------------------------------------------- filter and bind

    def filter(self, obj: KubeObject, pod: Pod, node_names: Sequence[str]) -> GangAnswer | None:
        """A gang member's answer (None: the pod is no gang member, or one placed like any pod)."""
        self.expire()
        try:
            ref = group_of(obj)
        except GangError as exc:
            reason = f"pod {pod.namespace}/{pod.name}: {exc}"
            self._tell(obj, "InvalidGang", reason)
            return None, reason
        if ref is None:
            return None
        key = pod_key(pod.namespace, pod.name)
        self._observe(obj)
        with self._lock:
            hold = self._holds.get(ref.key) or self._recover(ref)
            if hold is not None:
                if key in hold.members:
                    return self._claim(hold, key, obj, node_names)
                return None  # a member beyond those held: placed like any pod
        cooling = self._cooling.get(ref.key)
        if cooling is not None and cooling[0] > self.clock():
            reason = (
                f"gang {ref.name} did not complete within its timeout {cooling[1]} time(s) in a row (a member never "
                f"reached its node): it holds nothing until {_clock_time(cooling[0])} UTC, then is placed again"
            )
            self._tell(obj, "GangWaiting", reason)
            return None, reason
        need, reason = members_needed(self.host.cluster, ref)
        if need is None:
            self._tell(obj, "GangWaiting", reason)
            return None, reason
        with self._lock:
            waiting = self._waiting_members(ref, key, obj)
            need -= self._running(ref)
            if need <= 0:
                return None  # enough members run already: the rest are placed like any pod
            if len(waiting) < need:
                reason = (
                    f"gang {ref.name}: {len(waiting)} of the {need} members it still needs exist; "
                    "waiting for the others before holding any device"
                )
                self._tell(obj, "GangWaiting", reason)
                return None, reason
            answer, hold = self._hold(ref, waiting[:need], node_names)
            if hold is None:
                self._tell(obj, "GangDoesNotFit", answer[1])
                return answer
        written = self._write(hold)
        if written:
            self._withdraw([self._drop(hold)])
            return None, f"gang {ref.name}: {written}"
        with self._lock:
            self._arm(hold)
            return self._claim(hold, key, obj, node_names)

    def may_bind(self, namespace: str, name: str) -> str:
        """Why a held member may not bind yet ("": it may; its gang is complete, or it holds nothing)."""
        self.expire()
        key = pod_key(namespace, name)
        with self._lock:
            hold = self._holds.get(self._held.get(key, ""))
            if hold is None:
                return ""
            if not hold.complete:
                return (
                    f"gang {hold.group.name}: {len(hold.claimed)} of its {len(hold.members)} held members have reached "
                    "the scheduler; each binds once all have (kube-scheduler retries the pod)"
                )
            return ""

    def expire(self) -> None:
        """Release every hold past its deadline that is not complete."""
        now = self.clock()
        with self._lock:
            late = [h for h in self._holds.values() if not h.complete and h.deadline <= now]
            released = [self._drop(h) for h in late]
            for hold in released:
                strikes = self._cooling.get(hold.group.key, (0.0, 0))[1] + 1
                backoff = min(MAX_COOLING_SECONDS, hold.group.timeout * 2 ** (strikes - 1))
                self._cooling[hold.group.key] = (now + backoff, strikes)
        for hold in released:
            log.info("gang %s did not complete within %.0f s: released", hold.group.key, hold.group.timeout)
            self._withdraw([hold], f"did not complete within {hold.group.timeout:.0f} s")

    # ---------------------------------------------------------------------------------- internals

    def _waiting_members(self, ref: GroupRef, key: str, obj: KubeObject) -> list[KubeObject]:
        """The members not yet bound, this pod first, then by name; `need` less those already bound is applied by
        the caller. Called under the lock."""
        members = self._members.get(ref.key, {})
        members[key] = obj
        waiting = [o for k, o in sorted(members.items()) if k != key and not (o.get("spec") or {}).get("nodeName")]
        return [obj, *waiting]

    def _running(self, ref: GroupRef) -> int:
        """How many of the gang's members are bound already. Called under the lock."""
        return sum(1 for o in self._members.get(ref.key, {}).values() if (o.get("spec") or {}).get("nodeName"))

    def _hold(
        self, ref: GroupRef, members: list[KubeObject], node_names: Sequence[str]
    ) -> tuple[GangAnswer, Hold | None]:
        """Decide and count every member, or nothing. Called under the lock."""
        pods = [Pod.from_api(o) for o in members]
        candidates: Sequence[Sequence[str]] = [[n] for n in node_names] if ref.one_node else [node_names]
        reason = ""
        with self.host.state.lock:
            for names in candidates:
                held: dict[str, PendingDecision] = {}
                for pod in pods:
                    placed = self.host.place(pod, names)
                    decision = self._decided(pod) if placed.node else None
                    if decision is None:
                        why = placed.error or _first(placed.failed) or "no node fits it"
                        reason = f"gang {ref.name}: member {pod.name} fits on none of the offered nodes ({why})"
                        if ref.one_node:
                            reason = f"gang {ref.name}: no offered node takes all {len(pods)} members ({why})"
                        for pending in held.values():
                            pending.undo.abandon("its gang does not fit")
                            if not self.record_at_bind:  # the filter wrote it
                                self.host.writer.withdraw(pending.decision.pod)
                        break
                    held[pod_key(pod.namespace, pod.name)] = decision
                else:
                    timeout = ref.timeout
                    hold = Hold(ref, held, self.clock() + timeout)
                    self._holds[ref.key] = hold
                    self._held.update(dict.fromkeys(held, ref.key))
                    return (None, ""), hold
        return (None, reason), None

    @property
    def record_at_bind(self) -> bool:
        """Decisions wait for their bind to be written (`ExtenderSettings.record_at_bind`)."""
        return self.host.settings.record_at_bind

    def _decided(self, pod: Pod) -> PendingDecision | None:
        """The decision the filter just counted for `pod`, and how to take it back."""
        if self.record_at_bind:
            return self.host.pending.take(pod.namespace, pod.name)
        return self._from_state(pod)

    def _from_state(self, pod: Pod) -> PendingDecision | None:
        """The pod's placement as the state counts it (written on the pod), as a decision with its undo."""
        state, quota = self.host.state, self.host.quota
        with state.lock:
            record = state.pods.get(pod_key(pod.namespace, pod.name))
            if record is None or record.bound or (record.uid and pod.uid and record.uid != pod.uid):
                return None
            kept = {k: v for k, v in record.annotations.items() if k not in _NOT_CARRIED}
            decision = Decision(pod, record.node, dict(record.allocation), kept)
        undo = Transaction()
        if quota is not None:
            undo.add(lambda: quota.release(pod.namespace, pod.name), "the quota reservation")
        undo.add(lambda: state.remove_pod(pod.namespace, pod.name), "the hold")
        return PendingDecision(decision, undo)

    def _write(self, hold: Hold) -> str:
        """Write the hold onto each member (with `record_at_bind` the filter wrote nothing); why not ("": done)."""
        if not self.record_at_bind:
            return ""
        for key, pending in hold.members.items():
            try:
                self.host.writer.write(pending.decision)
            except ClusterError as exc:
                return f"could not record the hold of {key}: {exc}"
        return ""

    def _recover(self, ref: GroupRef) -> Hold | None:
        """After a restart: the gang's unbound members that carry a placement are its hold. Called under the lock."""
        held: dict[str, PendingDecision] = {}
        written = 0.0
        for key, obj in self._members.get(ref.key, {}).items():
            annotations = meta(obj).get("annotations") or {}
            if (obj.get("spec") or {}).get("nodeName") or not annotations.get(VGPU_NODE_ANNOTATION):
                continue
            decision = self._from_state(Pod.from_api(obj))
            if decision is not None:
                held[key] = decision
                with contextlib.suppress(ValueError):
                    written = max(written, float(str(annotations.get(VGPU_TIME) or 0)))
        if not held:
            return None
        hold = Hold(ref, held, (written or self.clock()) + ref.timeout)
        self._holds[ref.key] = hold
        self._held.update(dict.fromkeys(held, ref.key))
        self._arm(hold)
        log.info("gang %s: %d holds taken back from their pods", ref.key, len(held))
        return hold

    def _claim(self, hold: Hold, key: str, obj: KubeObject, node_names: Sequence[str]) -> GangAnswer:
        """A held member's filter: its node, when offered and still counted. Called under the lock."""
        pending = hold.members[key]
        node, name = pending.decision.node, hold.group.name
        if node not in node_names:
            reason = (
                f"gang {name}: the devices of this member are held on node {node}, which kube-scheduler did not "
                f"offer; waiting (the gang's holds are released if it is not complete by then)"
            )
            self._tell(obj, "GangWaiting", reason)
            return None, reason
        with self.host.state.lock:
            record = self.host.state.pods.get(key)
            counted = record is not None and record.node == node
        if not counted:  # its bind failed and took the decision back, or the pod was replaced
            hold.members.pop(key, None)
            hold.claimed.discard(key)
            self._held.pop(key, None)
            if hold.complete:
                return None, f"gang {name}: the hold of this member was lost; kube-scheduler will retry it"
            self._withdraw([self._drop(hold)], "lost a member's hold")
            return None, f"gang {name}: the hold of a member was lost; the gang is placed again at the next filter"
        if self.record_at_bind:
            self.host.pending.put(pending)
        hold.claimed.add(key)
        if hold.complete:
            self._cooling.pop(hold.group.key, None)
        return node, ""

    def _drop(self, hold: Hold) -> Hold:
        """Forget the hold and take its decisions back from the state (the pods' placements: `_withdraw`). Called
        under the lock."""
        self._holds.pop(hold.group.key, None)
        for key, pending in hold.members.items():
            self._held.pop(key, None)
            pod = pending.decision.pod
            self.host.pending.take(pod.namespace, pod.name)  # a bind must not find it
            pending.undo.abandon("its gang's hold was released")
        return hold

    def _withdraw(self, holds: Sequence[Hold], why: str = "") -> None:
        """Remove the released holds' placements from their pods (outside the locks: API calls), then say so on each
        (an Event is recorded only once every placement of its gang is withdrawn)."""
        for hold in holds:
            for pending in hold.members.values():
                self.host.writer.withdraw(pending.decision.pod)
            for pending in hold.members.values() if why else ():
                pod = pending.decision.pod
                obj = {"kind": "Pod", "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}}
                self._tell(obj, "GangReleased", f"gang {hold.group.name} {why}: its devices were released")

    def _arm(self, hold: Hold) -> None:
        """Release the hold at its deadline even if no filter comes."""
        timer = threading.Timer(max(0.0, hold.deadline - self.clock()) + 0.05, self.expire)
        timer.daemon = True
        timer.start()
        self._timers = [t for t in self._timers if t.is_alive()] + [timer]

    def _tell(self, obj: KubeObject, reason: str, message: str) -> None:
        m = meta(obj)
        told = (pod_key(str(m.get("namespace") or "default"), str(m.get("name"))), message)
        with self._lock:
            if told in self._told:
                return
            if len(self._told) > 10_000:
                self._told.clear()
            self._told.add(told)
        try:
            self.host.cluster.record_event(obj, reason, message, warning=True)
        except ClusterError as exc:
            log.warning("could not record event %s on %s: %s", reason, told[0], exc)

    def stop(self) -> None:
        for timer in self._timers:
            timer.cancel()


_NOT_CARRIED = frozenset({BIND_PHASE, BIND_TIME, SIGNATURE_ANNOTATION, VGPU_NODE_ANNOTATION, VGPU_TIME})


def _clock_time(when: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(when))


def _first(failed: Mapping[str, str]) -> str:
    return next(iter(failed.values()), "")
