"""Allocate through the real device-plugin socket, in-process: which pod, which containers, annotations, locks."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import scripted_vendor
from lagging_cluster import LaggingCluster
from node_harness import (
    NODE,
    DaemonThread,
    dev,
    eventually,
    lock_node,
    node_annotations,
    place_pod,
    pod_annotations,
    scripted_devices,
    write_script,
)

from hami.cluster import MemoryCluster, meta
from hami.cluster.locks import LOCK_ANNOTATION, NodeLocks
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, DaemonLease, holder_of
from hami.node.daemon import NodeSettings
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.testing.kubelet import FakeKubelet, PluginCallError

RESOURCE = "scripted.example/accel"
TO_ALLOCATE = "hami.io/scripted-devices-to-allocate"
ALLOCATED = "hami.io/scripted-devices-allocated"

StartDaemon = Callable[..., DaemonThread]


@pytest.fixture
def ready(start_daemon: StartDaemon, kubelet: FakeKubelet) -> DaemonThread:
    daemon = start_daemon()
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    return daemon


def locked(cluster: MemoryCluster) -> bool:
    return LOCK_ANNOTATION in node_annotations(cluster, NODE)


def test_single_container_gets_its_edits_and_the_pod_is_marked_allocated(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]})
    edits = kubelet.start_container(RESOURCE, 1)
    assert edits.env == {
        "SCRIPTED_VISIBLE_DEVICES": "SCR-1",
        "SCRIPTED_CONTAINER": "0",
        "SCRIPTED_MEMORY_LIMIT_0": "3000m",
        "SCRIPTED_CORE_LIMIT": "30",
    }
    assert [d.host_path for d in edits.devices] == ["/dev/scr-1"]
    assert edits.cdi_devices == ("scripted.example/accel=SCR-1",)
    got = pod_annotations(cluster, "p")
    assert got[TO_ALLOCATE] == ";"  # the served entry is emptied, its position kept
    assert got[ALLOCATED] == "SCR-1,Scripted,3000,30:;"  # kept for the scheduler's accounting
    assert got[BIND_PHASE] == "success"
    assert not locked(cluster)


def test_multi_container_pod_keeps_the_lock_until_its_last_container(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-0"), dev("SCR-1")]]})
    first = kubelet.start_container(RESOURCE, 1)
    assert first.env["SCRIPTED_CONTAINER"] == "0"
    assert pod_annotations(cluster, "p")[TO_ALLOCATE] == ";SCR-0,Scripted,1000,10:SCR-1,Scripted,1000,10:;"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "allocating"
    assert locked(cluster)  # the next Allocate must still find the pod
    second = kubelet.start_container(RESOURCE, 2)
    assert second.env["SCRIPTED_CONTAINER"] == "1"
    assert second.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0,SCR-1"
    assert pod_annotations(cluster, "p")[TO_ALLOCATE] == ";;"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"
    assert not locked(cluster)


def test_init_containers_are_served_first_and_containers_without_devices_are_skipped(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0", mem=500)], [], [dev("SCR-1", mem=700)]]}, init=1)
    init = kubelet.start_container(RESOURCE, 1)
    assert (init.env["SCRIPTED_CONTAINER"], init.env["SCRIPTED_MEMORY_LIMIT_0"]) == ("0", "500m")
    app = kubelet.start_container(RESOURCE, 1)
    assert (app.env["SCRIPTED_CONTAINER"], app.env["SCRIPTED_MEMORY_LIMIT_0"]) == ("2", "700m")
    assert pod_annotations(cluster, "p")[TO_ALLOCATE] == ";;;"
    assert not locked(cluster)


def test_a_sidecar_is_served_in_its_place_among_the_init_containers(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    # the kubelet allocates init containers (native sidecars among them) in spec order, then the app containers;
    # the scheduler wrote the sidecar's entry at its own position, as HAMi writes its init containers'
    placements = [[dev("SCR-0", mem=500)], [dev("SCR-1", mem=600)], [dev("SCR-0", mem=700)]]
    place_pod(cluster, NODE, "p", {"Scripted": placements}, init=2, sidecars=[1])
    served = [kubelet.start_container(RESOURCE, 1) for _ in placements]
    assert [(e.env["SCRIPTED_CONTAINER"], e.env["SCRIPTED_VISIBLE_DEVICES"], e.env["SCRIPTED_MEMORY_LIMIT_0"])
            for e in served] == [("0", "SCR-0", "500m"), ("1", "SCR-1", "600m"), ("2", "SCR-0", "700m")]  # fmt: skip
    got = pod_annotations(cluster, "p")
    assert got[TO_ALLOCATE] == ";;;"
    assert got[ALLOCATED] == "SCR-0,Scripted,500,10:;SCR-1,Scripted,600,10:;SCR-0,Scripted,700,10:;"
    assert got[BIND_PHASE] == "success"
    assert not locked(cluster)


def test_one_allocate_call_may_carry_several_containers(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]})
    edits = kubelet.client(RESOURCE).allocate([["SCR-0-0"], ["SCR-1-0"]])
    assert [e.env["SCRIPTED_VISIBLE_DEVICES"] for e in edits] == ["SCR-0", "SCR-1"]
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


def test_device_count_mismatch_fails_the_pod_and_releases_the_lock(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0"), dev("SCR-1")]]})
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 1)
    assert refused.value.code == "FAILED_PRECONDITION"
    assert "container c0 was given 1 Scripted device ID(s) by the kubelet, but the scheduler placed 2" in (
        refused.value.details
    )
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "failed"
    assert not locked(cluster)


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        ("refuse", "device SCR-0 is refused by the script"),
        ("refuse_allocate", "device SCR-0 cannot be partitioned (refused by the script)"),
    ],
)
def test_a_vendor_refusal_reaches_the_kubelet_and_releases_the_lock(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path, knob: str, message: str
) -> None:
    write_script(script, {"Scripted": scripted_devices(2)}, **{knob: ["SCR-0"]})
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")]]})
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 1)
    assert refused.value.details == f"pod default/p: {message}"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "failed"
    assert pod_annotations(cluster, "p")[TO_ALLOCATE] == "SCR-0,Scripted,1000,10:;"  # nothing was served
    assert not locked(cluster)
    event = cluster.events[-1]
    assert (event["reason"], event["type"], event["involvedObject"]["name"]) == (
        "DeviceAllocationFailed",
        "Warning",
        "p",
    )
    assert event["message"] == f"cannot allocate Scripted devices on node {NODE}: {message}"


def test_allocate_with_no_pod_waiting_is_refused_with_a_clear_error(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "running", {"Scripted": [[dev("SCR-0")]]}, lock=False, phase="Running")
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 1)
    assert refused.value.details.startswith(
        f"no pod is waiting for Scripted devices on node {NODE}: no lock, and no pod bound here has bind-phase "
        "allocating with devices in hami.io/scripted-devices-to-allocate."
    )


def test_without_a_lock_the_only_allocating_pod_is_served(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1")]]}, lock=False)
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


def test_without_a_lock_two_allocating_pods_are_not_guessed_between(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "a", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    place_pod(cluster, NODE, "b", {"Scripted": [[dev("SCR-1")]]}, lock=False)
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 1)
    assert "2 pods are allocating Scripted devices here (default/a, default/b)" in refused.value.details
    assert [pod_annotations(cluster, p)[BIND_PHASE] for p in ("a", "b")] == ["allocating", "allocating"]


def test_lock_of_a_deleted_pod_is_released_and_allocate_refused(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    lock_node(cluster, NODE, "default", "gone", "uid-gone")
    with pytest.raises(PluginCallError) as refused:
        kubelet.start_container(RESOURCE, 1)
    assert "no pod is waiting for Scripted devices" in refused.value.details
    assert not locked(cluster)


def test_lock_naming_an_earlier_pod_of_the_same_name_is_not_trusted(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")]]}, lock=False, phase="Running")
    lock_node(cluster, NODE, "default", "p", "uid-of-an-earlier-p")
    with pytest.raises(PluginCallError):
        kubelet.start_container(RESOURCE, 1)
    assert not locked(cluster)
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "allocating"  # not the pod that was asked about


def test_allocations_of_a_node_are_serialized(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    write_script(script, {"Scripted": scripted_devices(2)}, edits_delay=0.05)
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]})
    client = kubelet.client(RESOURCE)
    answers: list[str] = []

    def start(ids: list[str]) -> None:
        answers.append(client.allocate([ids])[0].env["SCRIPTED_CONTAINER"])

    threads = [threading.Thread(target=start, args=([i],)) for i in ("SCR-0-0", "SCR-1-0")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(answers) == ["0", "1"]  # each call took the next container: neither saw a stale annotation
    assert scripted_vendor.CONCURRENCY["max"] == 1
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


def test_finished_pods_are_released_and_leave_the_metrics(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]})
    kubelet.client(RESOURCE).allocate([["SCR-0-0"], ["SCR-1-0"]])
    assert len(ready.daemon.served.containers()) == 2
    cluster.delete("pods", "p", "default")
    eventually(lambda: scripted_vendor.RELEASED, what="hami_release called")
    assert scripted_vendor.RELEASED == [("Scripted", "p", 2)]
    assert ready.daemon.served.containers() == []


def test_a_capacity_kind_serves_its_memory_resource_without_touching_the_pod(
    start_daemon: StartDaemon, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    devices = [{"id": "CAP-0", "index": 0, "devmem": 4096}, {"id": "CAP-1", "index": 1, "devmem": 2048}]
    write_script(script, {"ScriptedCap": devices})
    start_daemon()
    assert [d.id for d in kubelet.wait_for_devices("cap.example/accel")] == ["CAP-0", "CAP-1"]
    memory = kubelet.wait_for_devices("cap.example/accel-memory")
    assert len(memory) == 4 + 2  # one ID per 1024 MiB unit: the node's capacity carries the memory
    place_pod(cluster, NODE, "p", {"ScriptedCap": [[dev("CAP-1", kind="ScriptedCap")]]})
    before = meta(cluster.get("pods", "p", "default"))["resourceVersion"]
    assert kubelet.client("cap.example/accel-memory").allocate([[memory[0].id]])[0].env == {}
    assert meta(cluster.get("pods", "p", "default"))["resourceVersion"] == before
    assert kubelet.start_container("cap.example/accel", 1).env["SCRIPTEDCAP_VISIBLE_DEVICES"] == "CAP-1"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


def test_annotations_returned_by_allocate_are_written_back_and_seen_by_the_containers_edits(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    made = {"scripted.example/partition": "part-of-container-{container}"}
    write_script(script, {"Scripted": scripted_devices(2)}, allocate_annotations=made)
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]})
    first, second = kubelet.client(RESOURCE).allocate([["SCR-0-0"], ["SCR-1-0"]])
    assert first.env["SCRIPTED_SEEN_PARTITION"] == "part-of-container-0"  # the edits see what allocate made
    assert second.env["SCRIPTED_SEEN_PARTITION"] == "part-of-container-1"
    got = pod_annotations(cluster, "p")
    assert got["scripted.example/partition"] == "part-of-container-1"  # the later container's value, once
    assert (got[TO_ALLOCATE], got[BIND_PHASE]) == (";;", "success")
    assert not locked(cluster)


def test_annotations_from_allocate_reach_the_pod_one_allocate_call_at_a_time(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    write_script(
        script, {"Scripted": scripted_devices(2)}, allocate_annotations={"scripted.example/made": "{container}"}
    )
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]})
    kubelet.start_container(RESOURCE, 1)
    got = pod_annotations(cluster, "p")
    assert (got["scripted.example/made"], got[TO_ALLOCATE], got[BIND_PHASE]) == (
        "0",
        ";SCR-1,Scripted,1000,10:;",
        "allocating",
    )
    kubelet.start_container(RESOURCE, 1)
    assert pod_annotations(cluster, "p")["scripted.example/made"] == "1"


def test_node_annotations_from_allocate_are_written_and_removed_but_not_the_daemons_own(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    cluster.patch_metadata("nodes", NODE, annotations={"vendor.example/lock": "2026-12-01T00:00:00Z"})
    on_node = {"vendor.example/lock": None, "vendor.example/served": "yes", "hami.io/node-scripted-register": "x"}
    write_script(script, {"Scripted": scripted_devices(2)}, allocate_node_annotations=on_node)
    register = node_annotations(cluster, NODE)["hami.io/node-scripted-register"]
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")]]})
    kubelet.start_container(RESOURCE, 1)
    got = node_annotations(cluster, NODE)
    assert "vendor.example/lock" not in got
    assert got["vendor.example/served"] == "yes"
    assert got["hami.io/node-scripted-register"] == register  # the daemon's key is not the vendor's to write


def test_a_vendor_annotation_cannot_overwrite_what_the_daemon_writes(
    ready: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, script: Path
) -> None:
    write_script(script, {"Scripted": scripted_devices(2)}, allocate_annotations={TO_ALLOCATE: "bogus"})
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")]]})
    kubelet.start_container(RESOURCE, 1)
    got = pod_annotations(cluster, "p")
    assert (got[TO_ALLOCATE], got[BIND_PHASE]) == (";", "success")


@pytest.fixture
def leasing(
    settings: NodeSettings, plugins: VendorPlugins, cluster: MemoryCluster, kubelet: FakeKubelet
) -> Iterator[DaemonThread]:
    """The daemon as the chart runs it: it offers its node lock as a Lease (`hami.cluster.nodelease`)."""
    lease = DaemonLease(cluster, NODE, "hami-system", pod_name="hami-node-x", pod_uid="uid-daemon")
    daemon = DaemonThread(settings, plugins, cluster, lease=lease).start()
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    eventually(lambda: LEASE_ANNOTATION in node_annotations(cluster, NODE), what="the Lease offered")
    yield daemon
    daemon.stop()


def test_the_pod_holding_the_nodes_lease_is_served_among_several_allocating_and_the_node_is_not_written(
    leasing: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    a = place_pod(cluster, NODE, "a", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    place_pod(cluster, NODE, "b", {"Scripted": [[dev("SCR-1")]]}, lock=False)
    NodeLocks(cluster).acquire(NODE, "default", "a", meta(a)["uid"])  # as the scheduler's bind takes it
    node_version = meta(cluster.get("nodes", NODE))["resourceVersion"]
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    assert pod_annotations(cluster, "a")[BIND_PHASE] == "success"
    assert pod_annotations(cluster, "b")[BIND_PHASE] == "allocating"
    assert meta(cluster.get("nodes", NODE))["resourceVersion"] == node_version
    held = holder_of(cluster.get("leases", LEASE_PREFIX + NODE, "hami-system"))
    assert held is not None
    assert held.name == "a"


def test_on_a_lease_node_a_pod_locked_by_hamis_scheduler_is_served_and_its_annotation_lock_released(
    leasing: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    """HAMi's scheduler knows no Lease: it locks the node annotation, which this daemon still reads."""
    place_pod(cluster, NODE, "a", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    place_pod(cluster, NODE, "b", {"Scripted": [[dev("SCR-1")]]})  # locked the annotation way
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert pod_annotations(cluster, "b")[BIND_PHASE] == "success"
    assert not locked(cluster)


LEASE = LEASE_PREFIX + NODE


def test_on_a_lease_node_the_pod_and_lease_are_read_from_the_api_servers_watch_cache(
    leasing: DaemonThread, kubelet: FakeKubelet, cluster: LaggingCluster
) -> None:
    a = place_pod(cluster, NODE, "a", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    NodeLocks(cluster).acquire(NODE, "default", "a", meta(a)["uid"])
    cluster.gets.clear()
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    assert pod_annotations(cluster, "a")[BIND_PHASE] == "success"
    cluster.gets[("pods", False)] -= 1  # pod_annotations' own read
    # GetPreferredAllocation, then Allocate: each reads the Lease and the pod, none from etcd
    assert +cluster.gets == {("leases", True): 2, ("pods", True): 2}


def test_a_watch_cache_behind_this_daemons_own_write_does_not_serve_a_container_twice(
    leasing: DaemonThread, kubelet: FakeKubelet, cluster: LaggingCluster
) -> None:
    """The kubelet asks for the next container as soon as the last one is answered: the watch cache may still
    show the pod before that answer's write, with the first container's devices pending."""
    p = place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-0")], [dev("SCR-1")]]}, lock=False)
    NodeLocks(cluster).acquire(NODE, "default", "p", meta(p)["uid"])
    cluster.hold("pods", "p", "default")
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    got = pod_annotations(cluster, "p")
    assert (got[TO_ALLOCATE], got[BIND_PHASE]) == (";;", "success")


def test_a_watch_cache_still_naming_the_last_holder_is_read_again_from_etcd(
    leasing: DaemonThread, kubelet: FakeKubelet, cluster: LaggingCluster
) -> None:
    a = place_pod(cluster, NODE, "a", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    scheduler = NodeLocks(cluster, holder_done=lambda lock, node: lock.name == "a")
    scheduler.acquire(NODE, "default", "a", meta(a)["uid"])
    cluster.hold("leases", LEASE, "hami-system")  # naming a, after a is served and b has taken the Lease
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    b = place_pod(cluster, NODE, "b", {"Scripted": [[dev("SCR-1")]]}, lock=False)
    scheduler.acquire(NODE, "default", "b", meta(b)["uid"])
    cluster.gets.clear()
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert pod_annotations(cluster, "b")[BIND_PHASE] == "success"
    # GetPreferredAllocation and Allocate each read it again: the cache named a, whose allocation is over
    assert (cluster.gets[("leases", True)], cluster.gets[("leases", False)]) == (2, 2)
