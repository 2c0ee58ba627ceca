"""The daemon and the real scheduler extender on one cluster: what bind leaves behind is what Allocate serves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from node_harness import NODE, DaemonThread, eventually, node_annotations, pod_annotations
from scheduler_harness import Harness

from hami.cluster import MemoryCluster
from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, DaemonLease
from hami.cluster.port import KubeObject, Resource
from hami.node.daemon import NodeSettings
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.scheduler.settings import ExtenderSettings
from hami.testing.kubelet import FakeKubelet


def test_a_pod_scheduled_by_the_extender_is_allocated_by_the_daemon(
    start_daemon: Callable[..., DaemonThread], kubelet: FakeKubelet, cluster: MemoryCluster, plugins: VendorPlugins
) -> None:
    start_daemon()
    eventually(lambda: node_annotations(cluster, NODE).get("hami.io/node-scripted-register"), what="registered")
    scheduler = Harness(cluster=cluster)
    scheduler.plugins = plugins
    scheduler.start()
    try:
        limits = {"scripted.example/accel": "2", "scripted.example/accel-memory": "1500"}
        cluster.create(
            "pods",
            {
                "metadata": {"name": "trainer", "namespace": "default"},
                "spec": {
                    "schedulerName": "hami-scheduler",
                    "containers": [{"name": "main", "resources": {"limits": limits}}],
                },
                "status": {"phase": "Pending"},
            },
        )
        eventually(lambda: scheduler.filter("trainer")["NodeNames"] == [NODE], what="the node fits the pod")
        assert scheduler.bind("trainer", NODE)["Error"] == ""
        assert LOCK_ANNOTATION in node_annotations(cluster, NODE)
        edits = kubelet.start_container("scripted.example/accel", 2)
    finally:
        scheduler.stop()
    assert sorted(edits.env["SCRIPTED_VISIBLE_DEVICES"].split(",")) == ["SCR-0", "SCR-1"]
    assert edits.env["SCRIPTED_MEMORY_LIMIT_0"] == edits.env["SCRIPTED_MEMORY_LIMIT_1"] == "1500m"
    got = pod_annotations(cluster, "trainer")
    assert got[BIND_PHASE] == "success"
    assert got["hami.io/scripted-devices-to-allocate"] == ";"
    assert LOCK_ANNOTATION not in node_annotations(cluster, NODE)


def test_on_a_node_offering_its_lease_two_pods_are_placed_and_served_in_turn_and_the_node_is_never_written(
    settings: NodeSettings, kubelet: FakeKubelet, plugins: VendorPlugins
) -> None:
    """This project's daemon offers its node lock as a Lease: the scheduler locks the node by writing the Lease,
    a second bind waits until the first pod's Allocate wrote its success (the pod watch wakes it), and no request of
    either writes the Node; each pod is written once by the daemon, entries and success together."""
    cluster = _Writes()
    cluster.create("nodes", {"metadata": {"name": NODE}})
    lease = DaemonLease(cluster, NODE, "hami-system", pod_name="hami-node-x1", pod_uid="uid-daemon")
    daemon = DaemonThread(settings, plugins, cluster, lease=lease).start()
    offered = "hami-system/" + LEASE_PREFIX + NODE
    eventually(lambda: node_annotations(cluster, NODE).get(LEASE_ANNOTATION) == offered, what="the Lease offered")
    eventually(lambda: node_annotations(cluster, NODE).get("hami.io/node-scripted-register"), what="registered")
    scheduler = Harness(ExtenderSettings(bind_lock_wait_seconds=10), cluster=cluster)
    scheduler.plugins = plugins
    scheduler.start()
    try:
        for name in ("first", "second"):
            cluster.create("pods", _scripted_pod(name))
            eventually(lambda n=name: scheduler.filter(n)["NodeNames"] == [NODE], what=f"{name} fits")
        cluster.writes.clear()
        assert scheduler.bind("first", NODE)["Error"] == ""
        second: list[dict[str, str]] = []
        waiting = threading.Thread(target=lambda: second.append(scheduler.bind("second", NODE)))
        waiting.start()
        waiting.join(0.3)
        assert waiting.is_alive(), "the Lease is held by `first`, which has not been allocated"
        first = kubelet.start_container("scripted.example/accel", 1)
        assert pod_annotations(cluster, "first")[BIND_PHASE] == "success"
        waiting.join(10)
        assert second == [{"Error": ""}]
        then = kubelet.start_container("scripted.example/accel", 1)
    finally:
        scheduler.stop()
        daemon.stop()
    assert first.env["SCRIPTED_VISIBLE_DEVICES"] != then.env["SCRIPTED_VISIBLE_DEVICES"]
    for name in ("first", "second"):
        assert pod_annotations(cluster, name)[BIND_PHASE] == "success"
    assert not [w for w in cluster.writes if w[0] == "nodes" and LOCK_ANNOTATION in w[1]]
    assert [w for w in cluster.writes if w[0] == "leases"] == [("leases", ()), ("leases", ())]
    daemon_writes = [w for w in cluster.writes if w[0] == "pods" and BIND_PHASE in w[1]]
    assert daemon_writes == [("pods", (BIND_PHASE, "hami.io/scripted-devices-to-allocate"))] * 2
    assert LOCK_ANNOTATION not in node_annotations(cluster, NODE)


class _Writes(MemoryCluster):
    """Records each write: the resource, and the annotation keys a patch sets."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[str, tuple[str, ...]]] = []

    def replace(self, resource: Resource, obj: KubeObject) -> KubeObject:
        self.writes.append((resource, ()))
        return super().replace(resource, obj)

    def patch_metadata(self, resource: Resource, name: str, namespace: str | None = None, **kw: Any) -> KubeObject:
        self.writes.append((resource, tuple(sorted(kw.get("annotations") or {}))))
        return super().patch_metadata(resource, name, namespace, **kw)


def _scripted_pod(name: str) -> KubeObject:
    limits = {"scripted.example/accel": "1", "scripted.example/accel-memory": "1500"}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }
