"""Allocate under signed placements: the node daemon serves only what the scheduler signed for the pod."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from node_harness import NODE, DaemonThread, dev, eventually, node_annotations, place_pod, pod_annotations
from scheduler_harness import Harness

from hami.cluster import MemoryCluster, meta
from hami.codec import encode_pod_devices
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignedPlacement
from hami.testing.kubelet import FakeKubelet, PluginCallError

RESOURCE = "scripted.example/accel"
TO_ALLOCATE = "hami.io/scripted-devices-to-allocate"
ALLOCATED = "hami.io/scripted-devices-allocated"

StartDaemon = Callable[..., DaemonThread]


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PlacementKeys:
    directory = tmp_path / "placement-keys"
    directory.mkdir()
    (directory / "current").write_bytes(b"n" * 32)
    monkeypatch.setenv("HAMI_PLACEMENT_KEYS", str(directory))
    return PlacementKeys.from_directory(directory)


@pytest.fixture
def verifying(keys: PlacementKeys, start_daemon: StartDaemon, kubelet: FakeKubelet) -> DaemonThread:
    daemon = start_daemon()
    assert daemon.daemon.placement_keys is not None
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    return daemon


def sign(cluster: MemoryCluster, keys: PlacementKeys, name: str) -> None:
    """What the scheduler's filter does: sign the allocated annotation for the pod's UID and node."""
    m = meta(cluster.get("pods", name, "default"))
    placement = SignedPlacement(m["uid"], NODE, {ALLOCATED: m["annotations"][ALLOCATED]})
    cluster.patch_metadata("pods", name, "default", annotations={SIGNATURE_ANNOTATION: keys.sign(placement)})


def test_a_signed_placement_is_served(
    verifying: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, keys: PlacementKeys
) -> None:
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]})
    sign(cluster, keys, "p")
    edits = kubelet.start_container(RESOURCE, 1)
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert edits.env["SCRIPTED_MEMORY_LIMIT_0"] == "3000m"
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "success"


def test_a_pod_that_bypassed_the_scheduler_gets_an_error_not_devices(
    verifying: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    """The tenant skips the webhook (hami.io/webhook: ignore), presets nodeName, and writes bind-phase allocating
    and its own to-allocate annotation asking for a whole device."""
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1", mem=8192, cores=100)]]})
    cluster.patch_metadata("pods", "p", "default", labels={"hami.io/webhook": "ignore"})
    with pytest.raises(PluginCallError, match="not placed by the HAMi scheduler"):
        kubelet.start_container(RESOURCE, 1)
    assert pod_annotations(cluster, "p")[BIND_PHASE] == "failed"
    events = [e for e in cluster.events if e["reason"] == "DeviceAllocationFailed"]
    assert "no valid placement signature" in events[0]["message"]


def test_rewriting_to_allocate_after_scheduling_is_refused(
    verifying: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, keys: PlacementKeys
) -> None:
    """The tenant lets the scheduler give it 3000 MiB and 30 % of SCR-1, then rewrites to-allocate (and allocated,
    so that the two agree) to ask for the whole device, keeping the scheduler's signature."""
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]})
    sign(cluster, keys, "p")
    whole = encode_pod_devices([(dev("SCR-1", mem=8192, cores=100),)])
    cluster.patch_metadata("pods", "p", "default", annotations={TO_ALLOCATE: whole, ALLOCATED: whole})
    with pytest.raises(PluginCallError, match="not the placement the scheduler signed"):
        kubelet.start_container(RESOURCE, 1)


def test_a_signature_copied_from_another_pod_is_refused(
    verifying: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, keys: PlacementKeys
) -> None:
    """The tenant copies a neighbour's valid signature (and its annotations) onto a pod it placed itself."""
    place_pod(cluster, NODE, "real", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]}, lock=False)
    sign(cluster, keys, "real")
    stolen = pod_annotations(cluster, "real")[SIGNATURE_ANNOTATION]
    place_pod(cluster, NODE, "copy", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]})
    cluster.patch_metadata("pods", "copy", "default", annotations={SIGNATURE_ANNOTATION: stolen})
    with pytest.raises(PluginCallError, match="was made for the pod with UID"):
        kubelet.start_container(RESOURCE, 1)


def test_a_forged_pod_cannot_make_the_real_one_ambiguous(
    verifying: DaemonThread, kubelet: FakeKubelet, cluster: MemoryCluster, keys: PlacementKeys
) -> None:
    """Without a node lock, the tenant adds a second pod with bind-phase allocating, so that the daemon cannot
    tell which pod the kubelet starts: the unsigned one is not a candidate."""
    place_pod(cluster, NODE, "real", {"Scripted": [[dev("SCR-0", mem=2000)]]}, lock=False)
    sign(cluster, keys, "real")
    place_pod(cluster, NODE, "forged", {"Scripted": [[dev("SCR-1", mem=8192, cores=100)]]}, lock=False)
    edits = kubelet.start_container(RESOURCE, 1)
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    assert pod_annotations(cluster, "real")[BIND_PHASE] == "success"


def test_without_keys_the_daemon_serves_as_hami_does(
    start_daemon: StartDaemon, kubelet: FakeKubelet, cluster: MemoryCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Compatibility (e.g. under HAMi's own scheduler): no key configured, the unsigned placement is served, and
    the daemon's log says that verification is off."""
    daemon = start_daemon()
    assert daemon.daemon.placement_keys is None
    assert "placement verification is OFF" in caplog.text
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    place_pod(cluster, NODE, "p", {"Scripted": [[dev("SCR-1", mem=3000)]]})
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"


def test_the_scheduler_and_the_daemon_agree_on_the_signature(
    keys: PlacementKeys, start_daemon: StartDaemon, kubelet: FakeKubelet, cluster: MemoryCluster, plugins: VendorPlugins
) -> None:
    start_daemon()
    eventually(lambda: node_annotations(cluster, NODE).get("hami.io/node-scripted-register"), what="registered")
    scheduler = Harness(cluster=cluster)
    scheduler.plugins = plugins
    scheduler.start()
    try:
        limits = {"scripted.example/accel": "1", "scripted.example/accel-memory": "1500"}
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
        edits = kubelet.start_container(RESOURCE, 1)
    finally:
        scheduler.stop()
    assert edits.env["SCRIPTED_MEMORY_LIMIT_0"] == "1500m"
    assert pod_annotations(cluster, "trainer")[BIND_PHASE] == "success"
