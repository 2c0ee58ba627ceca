"""The daemon and the real scheduler extender on one cluster: what bind leaves behind is what Allocate serves."""

from __future__ import annotations

from collections.abc import Callable

from node_harness import NODE, DaemonThread, eventually, node_annotations, pod_annotations
from scheduler_harness import Harness

from hami.cluster import MemoryCluster
from hami.cluster.locks import LOCK_ANNOTATION
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
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
