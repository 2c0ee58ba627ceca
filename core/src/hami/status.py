"""`hami status`: the cluster as the scheduler sees it: nodes, devices, what is used of them and by whom, locks.

Owns reading a cluster's Node and Pod objects once (through the `Cluster` port, so a real cluster through
`KubeCluster` and the demo's in-memory one are read alike), turning them into `ClusterStatus`, and printing
it as a table or JSON. Usage is computed by the scheduler's own accounting (`hami.scheduler.state.ClusterState`:
the `…-devices-allocated` annotations of live pods, init containers at their peak), so what this shows is what
the next filter decision starts from, room held for a preemptor included (`hami.scheduler.holds`: listed with
the pods evicted for it). Node locks are shown with their holder and age: the `hami.io/mutex.lock` annotation, or
the node's Lease where its daemon offers one (`hami.cluster.nodelease`; held while its holder is still allocating,
as the scheduler judges it), read from the few namespaces the offers name,
and pods that were bound but not yet allocated (`hami.io/bind-phase: allocating`) or whose allocation failed
are listed, since those are what a stuck pod looks like.

It only reads; nothing is written to the cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from hami.cluster.nodelease import holder_of, lease_ref
from hami.cluster.port import Cluster, ClusterError, KubeObject, meta
from hami.codec import AnnotationError, decode_node_lock
from hami.plugins import VendorPlugins

if TYPE_CHECKING:
    from hami.scheduler.state import ClusterState

__all__ = [
    "ClusterStatus",
    "DeviceStatus",
    "LockStatus",
    "NodeStatus",
    "PodShare",
    "WaitingPod",
    "add_status_parser",
    "collect_status",
    "connect_cluster",
    "lock_leases",
    "cores_text",
    "render_status",
]

LOCK_ANNOTATION = "hami.io/mutex.lock"
"""The node lock (`hami.cluster.locks.LOCK_ANNOTATION`; repeated here so `hami --help` stays light)."""
BIND_PHASE = "hami.io/bind-phase"
BIND_TIME = "hami.io/bind-time"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PodShare(_Model):
    """What one pod takes of one device (init containers at their peak, app containers summed)."""

    namespace: str
    name: str
    containers: int = Field(description="containers of the pod sharing the device")
    memory: int = Field(description="MiB")
    cores: int = Field(description="percent of the device")


class DeviceStatus(_Model):
    kind: str
    uuid: str
    index: int
    type: str
    health: bool
    mode: str
    memory_used: int
    memory_total: int
    cores_used: int
    cores_total: int
    shared_by: int = Field(description="containers using the device")
    split: int = Field(description="how many containers may share it")
    numa: int = Field(default=-1, description="NUMA node, -1 when unknown")
    pods: tuple[PodShare, ...] = ()


class LockStatus(_Model):
    """A node lock: the pod between bind and Allocate, and since when."""

    namespace: str
    name: str
    uid: str
    since: str = Field(description="RFC 3339")
    seconds: float = Field(description="how long it has been held")
    malformed: str = ""
    lease: str = Field(default="", description="`namespace/name` of the Lease holding it; empty: the node annotation")


class NodeStatus(_Model):
    name: str
    devices: tuple[DeviceStatus, ...] = ()
    lock: LockStatus | None = None


class WaitingPod(_Model):
    """A pod bound to a node whose allocation has not succeeded: waiting for the kubelet, or failed."""

    namespace: str
    name: str
    node: str
    phase: str = Field(description="hami.io/bind-phase: allocating or failed")
    seconds: float | None = Field(default=None, description="since the bind, when the pod says (hami.io/bind-time)")


class HeldRoom(_Model):
    """Room a preemption freed, held for its preemptor (`hami.scheduler.holds`) and counted as used meanwhile."""

    namespace: str
    name: str
    node: str
    seconds: float = Field(description="until the hold expires")
    victims: tuple[str, ...] = Field(default=(), description="the pods evicted for it")
    leaving: tuple[str, ...] = Field(default=(), description="those of them still counted on the node")
    memory: int = Field(default=0, description="MiB held, over every device")


class ClusterStatus(_Model):
    nodes: tuple[NodeStatus, ...] = ()
    waiting: tuple[WaitingPod, ...] = ()
    holds: tuple[HeldRoom, ...] = ()
    pods: int = Field(default=0, description="live pods using devices")

    def device(self, uuid: str) -> DeviceStatus | None:
        for node in self.nodes:
            for device in node.devices:
                if device.uuid == uuid:
                    return device
        return None


# --------------------------------------------------------------------------------------------------------
# Collecting
# --------------------------------------------------------------------------------------------------------


def collect_status(cluster: Cluster, plugins: VendorPlugins, *, now: datetime | None = None) -> ClusterStatus:
    """Read nodes and pods once and account them as the scheduler does."""
    nodes, _ = cluster.list("nodes")
    pods, _ = cluster.list("pods")
    return status_of(nodes, pods, plugins, now=now, leases=lock_leases(cluster, nodes))


def lock_leases(cluster: Cluster, nodes: Iterable[KubeObject]) -> list[KubeObject]:
    """The Leases of the namespaces the nodes' lock offers name (`hami.io/node-lock-lease`): usually one list of
    one namespace. A namespace that cannot be listed (no permission) is skipped: those locks are then not shown."""
    namespaces = {ref[0] for n in nodes if (ref := lease_ref(meta(n).get("annotations") or {})) is not None}
    found: list[KubeObject] = []
    for namespace in sorted(namespaces):
        try:
            found.extend(cluster.list("leases", namespace)[0])
        except ClusterError:
            continue
    return found


def status_of(
    nodes: Iterable[KubeObject],
    pods: Iterable[KubeObject],
    plugins: VendorPlugins,
    *,
    now: datetime | None = None,
    leases: Iterable[KubeObject] = (),
) -> ClusterStatus:
    """`ClusterStatus` from listed Node and Pod objects (and the nodes' lock Leases, `lock_leases`)."""
    from hami.scheduler.holds import HoldBook
    from hami.scheduler.state import ClusterState

    now = now or datetime.now(UTC)
    nodes, pods = list(nodes), list(pods)
    held = _lease_locks(nodes, pods, leases, now)
    state = ClusterState(plugins)
    state.replay(nodes, pods)
    counted = len(state.pods)
    book = HoldBook(state, hold_seconds=float("inf"))  # as written: the scheduler may cap a hold it adopts
    book.adopt(pods, now=now.timestamp())
    holds = tuple(
        HeldRoom(
            namespace=h.namespace,
            name=h.name,
            node=h.node,
            seconds=max(0.0, h.until - now.timestamp()),
            victims=tuple(k for k, _ in h.victims),
            leaving=tuple(k for k, _ in h.victims if k in state.pods),
            memory=sum(d.usedmem for placement in h.allocation.values() for c in placement for d in c),
        )
        for h in sorted(book.holds.values(), key=lambda h: h.key)
    )
    return ClusterStatus(
        nodes=tuple(
            _node_status(node, state, now, held.get(str(meta(node).get("name"))))
            for node in sorted(nodes, key=lambda n: str(meta(n).get("name")))
        ),
        waiting=tuple(_waiting(pods, now)),
        holds=holds,
        pods=counted,
    )


def _node_status(node: KubeObject, state: ClusterState, now: datetime, leased: LockStatus | None) -> NodeStatus:
    name = str(meta(node).get("name"))
    record = state.nodes.get(name)
    devices: list[DeviceStatus] = []
    if record is not None:
        for kind, view in sorted(record.views.items()):
            for usage in view.devices:
                shares = []
                for key in sorted(record.pods):
                    pod = state.pods.get(key)
                    grant = pod.grants.get(kind, {}).get(usage.device.id) if pod is not None else None
                    if grant is None:
                        continue
                    namespace, _, pod_name = key.partition("/")
                    shares.append(
                        PodShare(
                            namespace=namespace,
                            name=pod_name,
                            containers=grant.slots,
                            memory=grant.memory,
                            cores=grant.cores,
                        )
                    )
                d = usage.device
                devices.append(
                    DeviceStatus(
                        kind=kind,
                        uuid=d.id,
                        index=d.index,
                        type=d.type or kind,
                        health=d.health,
                        mode=d.mode,
                        memory_used=usage.usedmem,
                        memory_total=d.devmem,
                        cores_used=usage.usedcores,
                        cores_total=d.devcore,
                        shared_by=usage.used,
                        split=d.count,
                        numa=d.numa,
                        pods=tuple(shares),
                    )
                )
    devices.sort(key=lambda d: (d.kind, d.index, d.uuid))
    lock = _lock(meta(node).get("annotations") or {}, now) or leased
    return NodeStatus(name=name, devices=tuple(devices), lock=lock)


def _lease_locks(
    nodes: Iterable[KubeObject], pods: Iterable[KubeObject], leases: Iterable[KubeObject], now: datetime
) -> dict[str, LockStatus]:
    """node → the lock its Lease holds, for nodes offering one whose holder is still allocating (a Lease is never
    released: a holder that finished, failed or is gone no longer holds it)."""
    by_ref = {(str(meta(x).get("namespace")), str(meta(x).get("name"))): x for x in leases}
    if not by_ref:
        return {}
    allocating = {
        (str(meta(p).get("namespace")), str(meta(p).get("name")), str(meta(p).get("uid")))
        for p in pods
        if (meta(p).get("annotations") or {}).get(BIND_PHASE) == "allocating"
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    }
    found = {}
    for node in nodes:
        ref = lease_ref(meta(node).get("annotations") or {})
        lease = by_ref.get(ref) if ref is not None else None
        holder = holder_of(lease) if lease is not None else None
        if ref is None or holder is None or (holder.namespace, holder.name, holder.uid) not in allocating:
            continue
        found[str(meta(node).get("name"))] = LockStatus(
            namespace=holder.namespace,
            name=holder.name,
            uid=holder.uid,
            since=holder.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=max(0.0, (now - holder.time).total_seconds()),
            lease=f"{ref[0]}/{ref[1]}",
        )
    return found


def _lock(annotations: Mapping[str, str], now: datetime) -> LockStatus | None:
    value = annotations.get(LOCK_ANNOTATION)
    if not value:
        return None
    try:
        lock = decode_node_lock(value, LOCK_ANNOTATION)
    except AnnotationError as exc:
        return LockStatus(namespace="", name="", uid="", since="", seconds=0.0, malformed=str(exc))
    since = lock.time if lock.time.tzinfo else lock.time.replace(tzinfo=UTC)
    return LockStatus(
        namespace=lock.namespace,
        name=lock.name,
        uid=lock.uid,
        since=since.strftime("%Y-%m-%dT%H:%M:%SZ"),
        seconds=max(0.0, (now - since).total_seconds()),
    )


def _waiting(pods: Iterable[KubeObject], now: datetime) -> Iterable[WaitingPod]:
    for pod in pods:
        m = meta(pod)
        annotations = m.get("annotations") or {}
        phase = annotations.get(BIND_PHASE)
        status_phase = (pod.get("status") or {}).get("phase")
        if phase not in ("allocating", "failed") or status_phase in ("Succeeded", "Failed"):
            continue
        seconds = None
        bound = annotations.get(BIND_TIME, "")
        if bound.isdigit():
            seconds = max(0.0, now.timestamp() - int(bound))
        yield WaitingPod(
            namespace=str(m.get("namespace") or "default"),
            name=str(m.get("name")),
            node=str((pod.get("spec") or {}).get("nodeName") or ""),
            phase=phase,
            seconds=seconds,
        )


# --------------------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------------------


def cores_text(cores: int, total: int, *, short: bool = False) -> str:
    """A grant's cores as its kind counts them: percent of the device (``25% cores``), or ``4/16 cores`` where a
    device registers another total (Moore Threads' 16 per GPU); `short` leaves out the word ``cores``."""
    text = f"{cores}%" if total in (0, 100) else f"{cores}/{total}"
    return text if short else f"{text} cores"


def _percent(used: int, total: int) -> str:
    return f"{100 * used // total}%" if total else "-"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _pods(device: DeviceStatus) -> str:
    parts = []
    for p in device.pods:
        share = f"{p.memory} MiB" + (f" {cores_text(p.cores, device.cores_total, short=True)}" if p.cores else "")
        who = p.name if p.namespace == "default" else f"{p.namespace}/{p.name}"
        parts.append(f"{who} ({share})")
    return ", ".join(parts) or "-"


def render_status(status: ClusterStatus, *, node: str | None = None) -> str:
    """The status as text: one table row per device, then node locks and pods waiting for Allocate."""
    rows = [("NODE", "DEVICE", "TYPE", "MEMORY MiB", "", "CORES", "SHARED", "PODS (memory, cores)")]
    nodes = [n for n in status.nodes if node is None or n.name == node]
    for n in nodes:
        if not n.devices:
            rows.append((n.name, "-", "no shared devices registered", "", "", "", "", ""))
        for d in n.devices:
            device = d.uuid + ("" if d.health else " (unhealthy)") + (f" [{d.mode}]" if d.mode == "mig" else "")
            rows.append(
                (
                    n.name,
                    device,
                    d.type,
                    f"{d.memory_used}/{d.memory_total}",
                    _percent(d.memory_used, d.memory_total),
                    f"{d.cores_used}/{d.cores_total}",
                    f"{d.shared_by}/{d.split}",
                    _pods(d),
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    used = sum(d.memory_used for n in nodes for d in n.devices)
    total = sum(d.memory_total for n in nodes for d in n.devices)
    count = sum(len(n.devices) for n in nodes)
    lines.append("")
    if node is None:
        pods = status.pods
    else:
        pods = len({(p.namespace, p.name) for n in nodes for d in n.devices for p in d.pods})
    lines.append(
        f"{len(nodes)} node(s), {count} device(s), {used}/{total} MiB allocated ({_percent(used, total)}), "
        f"{pods} pod(s) using devices"
    )
    locks = [n for n in nodes if n.lock is not None]
    if not locks:
        lines.append("node locks: none held")
    for n in locks:
        lock = n.lock
        assert lock is not None
        if lock.malformed:
            lines.append(f"node lock on {n.name}: malformed ({lock.malformed}); the scheduler treats it as free")
        else:
            lease = f" (Lease {lock.lease})" if lock.lease else ""
            lines.append(
                f"node lock on {n.name}{lease}: held by {lock.namespace}/{lock.name} for {_age(lock.seconds)} "
                f"(since {lock.since}); freed when its Allocate ends or the pod goes"
            )
    for h in status.holds:
        if node is not None and h.node != node:
            continue
        leaving = f"{len(h.leaving)} of {len(h.victims)} evicted pods still leaving"
        lines.append(
            f"held on {h.node} for {h.namespace}/{h.name}: {h.memory} MiB for {_age(h.seconds)} more "
            f"(preempted {', '.join(h.victims) or 'nobody'}; {leaving})"
        )
    for w in status.waiting:
        if node is not None and w.node != node:
            continue
        if w.phase == "allocating":
            since = f" for {_age(w.seconds)}" if w.seconds is not None else ""
            lines.append(f"pod {w.namespace}/{w.name} on {w.node}: waiting for the kubelet's Allocate{since}")
        else:
            since = f" (bound {_age(w.seconds)} ago)" if w.seconds is not None else ""
            lines.append(f"pod {w.namespace}/{w.name} on {w.node}: allocation failed{since}; its events say why")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------------


def add_status_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register `hami status` on the `hami` command's subparsers; returns the new parser."""
    parser = subparsers.add_parser(
        "status",
        help="show nodes, devices, their used/total memory and cores, the pods sharing them, and node locks",
        description="Show the cluster as the scheduler accounts it: every node's devices with used/total memory "
        "and cores, the pods sharing each device, node locks with their holder and age, and pods bound but not "
        "yet allocated. Reads nodes and pods once; writes nothing.",
        epilog=(
            "Examples:\n"
            "  hami status                              the cluster of $KUBECONFIG or ~/.kube/config\n"
            "  hami status --kubeconfig /tmp/hami-demo-x/kubeconfig   a running `hami demo --keep`\n"
            "  hami status --node gpu-node --json       one node, for scripts"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig to use (default: $KUBECONFIG or ~/.kube/config; the service account inside a pod)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    parser.add_argument("--config", metavar="FILE", help="configuration file (YAML): the vendors' sections")
    parser.add_argument("--node", metavar="NAME", help="only this node")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.set_defaults(func=run_status)
    return parser


def connect_cluster(kubeconfig: str | None, context: str | None, *, component: str = "hami-status") -> Cluster:
    """The cluster of a kubeconfig (or, inside a pod without one, the service account), for reading tools."""
    from hami.cluster.kube import KubeCluster

    if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return KubeCluster.from_kubeconfig(kubeconfig, context, component=component, attempts=2)
    return KubeCluster.in_cluster(component=component, attempts=2)


def run_status(args: argparse.Namespace) -> int:
    """What `hami status` runs."""
    from hami.config import load_config

    config = load_config(args.config, {"kubeconfig": args.kubeconfig})
    plugins = VendorPlugins.load(config=config.vendors)
    cluster = connect_cluster(config.kubeconfig, args.context)
    try:
        status = collect_status(cluster, plugins)
    finally:
        close = getattr(cluster, "close", None)
        if callable(close):
            close()
    if args.node is not None and all(n.name != args.node for n in status.nodes):
        from hami.errors import ConfigError

        names = ", ".join(n.name for n in status.nodes) or "none"
        raise ConfigError(f"hami status: the cluster has no node {args.node!r} (nodes: {names})")
    if args.json:
        data: dict[str, Any] = status.model_dump(mode="json")
        if args.node is not None:
            data["nodes"] = [n for n in data["nodes"] if n["name"] == args.node]
        print(json.dumps(data, indent=2 if sys.stdout.isatty() else None))
    else:
        print(render_status(status, node=args.node))
    return 0
