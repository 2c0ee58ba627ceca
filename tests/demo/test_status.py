"""`hami status`: usage per device as the scheduler accounts it, the pods sharing each device, locks with
their age, pods stuck between bind and Allocate; as a table, as JSON, and against an API server through a
kubeconfig (the real client backend)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from scheduler_harness import gpu_node, gpu_pod

from hami import status as status_module
from hami.cli import main
from hami.cluster import MemoryCluster, meta
from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, with_holder
from hami.codec import NodeLock, encode_node_lock, encode_pod_devices
from hami.model import ContainerDevice
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE, BIND_TIME
from hami.status import collect_status, cores_text, render_status, status_of

NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def placed(name: str, node: str, devices: list[list[tuple[str, int, int]]], **extra: Any) -> dict[str, Any]:
    """A pod as the scheduler leaves it: placed on `node` with (uuid, MiB, cores) per container."""
    pod = gpu_pod(name, apps=[{"nvidia.com/gpu": str(len(d))} for d in devices], **extra)
    value = encode_pod_devices([tuple(ContainerDevice(uuid=u, type="NVIDIA", usedmem=m, usedcores=c) for u, m, c in d)
                                for d in devices])  # fmt: skip
    pod["metadata"]["annotations"].update(
        {"hami.io/vgpu-devices-allocated": value, "hami.io/vgpu-node": node, BIND_PHASE: "success"}
    )
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return pod


@pytest.fixture
def world() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes = [gpu_node("n1", gpus=2, memory=16000), gpu_node("n2", gpus=1, memory=8000)]
    lock = encode_node_lock(NodeLock(NOW - timedelta(seconds=42), "default", "binding", "uid-1"))
    nodes[1]["metadata"]["annotations"][LOCK_ANNOTATION] = lock
    pods = [
        placed("a", "n1", [[("GPU-n1-0", 3000, 20)]]),
        placed("b", "n1", [[("GPU-n1-0", 1000, 0)], [("GPU-n1-0", 500, 10)]], namespace="team"),
        placed("done", "n1", [[("GPU-n1-1", 9000, 0)]]),
        placed("binding", "n2", [[("GPU-n2-0", 2000, 0)]]),
    ]
    pods[2]["status"]["phase"] = "Succeeded"  # finished: counts for nothing
    pods[3]["metadata"]["annotations"].update({BIND_PHASE: "allocating", BIND_TIME: str(int(NOW.timestamp()) - 30)})
    return nodes, pods


def test_usage_and_sharing_pods_are_counted_as_the_scheduler_does(world: Any) -> None:
    result = status_of(*world, VendorPlugins.load(), now=NOW)
    first = result.device("GPU-n1-0")
    assert first is not None
    assert (first.memory_used, first.memory_total, first.cores_used, first.shared_by, first.split) == (
        4500, 16000, 30, 3, 10,
    )  # fmt: skip
    assert [(p.namespace, p.name, p.containers, p.memory, p.cores) for p in first.pods] == [
        ("default", "a", 1, 3000, 20),
        ("team", "b", 2, 1500, 10),
    ]
    idle = result.device("GPU-n1-1")
    assert idle is not None
    assert (idle.memory_used, idle.pods) == (0, ())
    assert result.pods == 3


def test_locks_and_pods_waiting_for_allocate_are_shown_with_their_age(world: Any) -> None:
    result = status_of(*world, VendorPlugins.load(), now=NOW)
    n1, n2 = result.nodes
    assert n1.lock is None
    assert n2.lock is not None
    assert (n2.lock.namespace, n2.lock.name, n2.lock.uid, n2.lock.seconds) == ("default", "binding", "uid-1", 42.0)
    assert [(w.name, w.node, w.phase, w.seconds) for w in result.waiting] == [("binding", "n2", "allocating", 30.0)]
    text = render_status(result)
    assert "node lock on n2: held by default/binding for 42.0 s (since 2025-03-04T05:05:25Z)" in text
    assert "pod default/binding on n2: waiting for the kubelet's Allocate for 30.0 s" in text


def test_the_table_has_one_row_per_device_with_used_over_total(world: Any) -> None:
    text = render_status(status_of(*world, VendorPlugins.load(), now=NOW))
    rows = {line.split()[1]: line for line in text.splitlines()[1:4]}
    assert rows["GPU-n1-0"].split()[:7] == ["n1", "GPU-n1-0", "NVIDIA-A100", "4500/16000", "28%", "30/100", "3/10"]
    assert rows["GPU-n1-0"].endswith("a (3000 MiB 20%), team/b (1500 MiB 10%)")
    assert rows["GPU-n1-1"].endswith("-")
    assert "2 node(s), 3 device(s), 6500/40000 MiB allocated (16%)" in text


def test_a_malformed_lock_is_shown_as_such(world: Any) -> None:
    nodes, pods = world
    nodes[0]["metadata"]["annotations"][LOCK_ANNOTATION] = "yesterday"
    text = render_status(status_of(nodes, pods, VendorPlugins.load(), now=NOW))
    assert "node lock on n1: malformed" in text


def test_the_protocol_names_match_the_schedulers() -> None:
    assert status_module.LOCK_ANNOTATION == LOCK_ANNOTATION
    assert (status_module.BIND_PHASE, status_module.BIND_TIME) == (BIND_PHASE, BIND_TIME)


def test_hami_status_reads_a_cluster_through_a_kubeconfig(
    world: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes, pods = world
    cluster = MemoryCluster()
    for node in nodes:
        cluster.create("nodes", node)
    for pod in pods:
        cluster.create("pods", pod)
    with FakeApiServer(cluster) as api:
        kubeconfig = str(api.write_kubeconfig(tmp_path / "kubeconfig"))
        assert main(["status", "--kubeconfig", kubeconfig]) == 0
        text = capsys.readouterr().out
        assert main(["status", "--kubeconfig", kubeconfig, "--json", "--node", "n2"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert main(["status", "--kubeconfig", kubeconfig, "--node", "nowhere"]) == 2
        assert "the cluster has no node 'nowhere' (nodes: n1, n2)" in capsys.readouterr().err
    assert "GPU-n1-0" in text
    assert "node lock on n2: held by default/binding" in text
    assert [n["name"] for n in data["nodes"]] == ["n2"]
    assert data["nodes"][0]["devices"][0]["memory_used"] == 2000
    assert data["nodes"][0]["lock"]["name"] == "binding"


def test_an_unreachable_cluster_is_an_error_that_names_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert main(["status", "--kubeconfig", str(kubeconfig)]) == 2
    assert "127.0.0.1:9" in capsys.readouterr().err


def test_collect_status_reads_through_the_cluster_port(world: Any) -> None:
    cluster = MemoryCluster()
    for node in world[0]:
        cluster.create("nodes", node)
    assert [n.name for n in collect_status(cluster, VendorPlugins.load()).nodes] == ["n1", "n2"]


def test_cores_are_shown_as_the_kind_counts_them() -> None:
    """Percent of a device, or a share of the device's own count (Moore Threads registers 16 cores per GPU: a grant
    of 4 is "4/16", not "4%")."""
    assert cores_text(25, 100) == "25% cores"
    assert cores_text(4, 16) == "4/16 cores"
    assert cores_text(4, 16, short=True) == "4/16"
    assert cores_text(30, 0, short=True) == "30%"


def test_a_lock_held_through_the_nodes_lease_is_shown_while_its_holder_allocates(world: Any) -> None:
    """A node whose daemon offers its lock as a Lease (`hami.cluster.nodelease`): the Lease is never released, so
    its holder is shown only while that pod still allocates; `hami status` reads the Leases the offers name."""
    nodes, pods = world
    del nodes[1]["metadata"]["annotations"][LOCK_ANNOTATION]
    cluster = MemoryCluster()
    for n in nodes:
        n["metadata"]["annotations"][LEASE_ANNOTATION] = f"hami-system/{LEASE_PREFIX}{n['metadata']['name']}"
        cluster.create("nodes", n)
    for p in pods:
        cluster.create("pods", p)
    uids = {meta(p)["name"]: meta(p)["uid"] for p in cluster.list("pods")[0]}
    for node, holder in (("n1", "a"), ("n2", "binding")):  # `a` is allocated: its Lease is free again
        lease = {"metadata": {"name": LEASE_PREFIX + node, "namespace": "hami-system"}, "spec": {}}
        cluster.create(
            "leases", with_holder(lease, NodeLock(NOW - timedelta(seconds=42), "default", holder, uids[holder]), 300)
        )
    result = collect_status(cluster, VendorPlugins.load(), now=NOW)
    n1, n2 = result.nodes
    assert n1.lock is None
    assert n2.lock is not None
    assert (n2.lock.name, n2.lock.seconds, n2.lock.lease) == ("binding", 42.0, f"hami-system/{LEASE_PREFIX}n2")
    assert f"node lock on n2 (Lease hami-system/{LEASE_PREFIX}n2): held by default/binding for 42.0 s" in (
        render_status(result)
    )
