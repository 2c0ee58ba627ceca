"""Node registration (annotations, handshake) and kubelet registration, in-process."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from node_harness import NODE, DaemonThread, eventually, node_annotations, scripted_devices, write_script

from hami.cluster import MemoryCluster, meta
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, DaemonLease
from hami.codec import Handshake, decode_legacy_register, decode_node_register, encode_handshake
from hami.model import Device, NodeInventory
from hami.node.daemon import NodeDaemon, NodeSettings
from hami.node.register import NodeRegistrar
from hami.plugins import VendorPlugins
from hami.testing.kubelet import FakeKubelet

StartDaemon = Callable[..., DaemonThread]
REGISTER = "hami.io/node-scripted-register"
HANDSHAKE = "hami.io/node-handshake-scripted"


def registrar(cluster: MemoryCluster, plugins: VendorPlugins) -> NodeRegistrar:
    return NodeRegistrar(cluster, plugins, NODE, clock=lambda: datetime(2025, 6, 7, 8, 9, 10, 123456))


def inventory(kind: str, *devices: Device, **annotations: str) -> dict[str, NodeInventory]:
    return {kind: NodeInventory(kind=kind, devices=devices, annotations=annotations)}


def test_each_register_format_is_written_as_the_scheduler_reads_it(
    cluster: MemoryCluster, plugins: VendorPlugins
) -> None:
    found = {
        **inventory("Scripted", Device(id="SCR-0", count=10, devmem=8192, type="Scripted-X", numa=1)),
        **inventory("ScriptedLegacy", Device(id="LEG-0", count=4, devmem=4096, type="Legacy-Y", index=0)),
        **inventory("ScriptedCap", Device(id="CAP-0", devmem=2048), **{"example.com/extra": "from-the-vendor"}),
    }
    written = registrar(cluster, plugins).sync(found)
    got = node_annotations(cluster, NODE)
    assert got[REGISTER] == (
        '[{"id":"SCR-0","count":10,"devmem":8192,"devcore":100,"type":"Scripted-X","numa":1,"health":true,"index":0}]'
    )
    assert got["hami.io/node-scriptedlegacy-register"] == "LEG-0,4,4096,100,Legacy-Y,0,true,0,:"
    assert decode_legacy_register(got["hami.io/node-scriptedlegacy-register"])[0].devmem == 4096
    assert got["example.com/extra"] == "from-the-vendor"  # a capacity kind has no register key: only extras
    assert got[HANDSHAKE] == got["hami.io/node-handshake-scriptedlegacy"] == "Reported_2025-06-07 08:09:10"
    assert set(written) == set(got)


def test_an_unchanged_node_is_not_written_again(cluster: MemoryCluster, plugins: VendorPlugins) -> None:
    r = registrar(cluster, plugins)
    found = inventory("Scripted", Device(id="SCR-0", count=10, devmem=8192))
    r.sync(found)
    version = meta(cluster.get("nodes", NODE))["resourceVersion"]
    assert r.sync(found) == {}
    assert meta(cluster.get("nodes", NODE))["resourceVersion"] == version


def test_a_requesting_or_deleted_handshake_is_answered_with_the_register(
    cluster: MemoryCluster, plugins: VendorPlugins
) -> None:
    r = registrar(cluster, plugins)
    found = inventory("Scripted", Device(id="SCR-0", count=10, devmem=8192))
    r.sync(found)
    for state in ("Requesting", "Deleted"):
        asked = encode_handshake(Handshake(state, datetime(2025, 1, 1)))  # type: ignore[arg-type]
        cluster.patch_metadata("nodes", NODE, annotations={HANDSHAKE: asked, REGISTER: None})
        assert set(r.sync(found)) == {HANDSHAKE, REGISTER}
        assert node_annotations(cluster, NODE)[HANDSHAKE] == "Reported_2025-06-07 08:09:10"


def test_a_kind_whose_devices_vanish_publishes_an_empty_register(
    start_daemon: StartDaemon, cluster: MemoryCluster, script: Path, kubelet: FakeKubelet
) -> None:
    start_daemon()
    eventually(lambda: node_annotations(cluster, NODE).get(REGISTER), what="register written")
    write_script(script, {})
    eventually(lambda: node_annotations(cluster, NODE)[REGISTER] == "[]", what="empty register")
    assert kubelet.wait_for_devices("scripted.example/accel", lambda ds: ds == []) == []


def test_annotations_removed_by_someone_else_are_repaired(start_daemon: StartDaemon, cluster: MemoryCluster) -> None:
    start_daemon()
    published = eventually(lambda: node_annotations(cluster, NODE).get(REGISTER), what="register written")
    cluster.patch_metadata("nodes", NODE, annotations={REGISTER: None})
    assert eventually(lambda: node_annotations(cluster, NODE).get(REGISTER), what="repaired") == published
    assert len(decode_node_register(published)) == 2


def test_health_changes_are_pushed_to_open_streams_and_unchanged_lists_are_not(
    start_daemon: StartDaemon, kubelet: FakeKubelet, script: Path
) -> None:
    daemon = start_daemon()
    resource = "scripted.example/accel"
    kubelet.wait_for_devices(resource, lambda ds: len(ds) == 8)
    updates = kubelet.updates(resource)
    seen = daemon.daemon.discoveries
    eventually(lambda: daemon.daemon.discoveries >= seen + 3, what="three more discoveries")  # no change: no list
    assert kubelet.updates(resource) == updates
    devices = scripted_devices(2)
    devices[0]["health"] = False
    write_script(script, {"Scripted": devices})
    pushed = kubelet.wait_for_devices(resource, lambda ds: not ds[0].healthy)
    assert [d.healthy for d in pushed] == [False] * 4 + [True] * 4
    assert kubelet.updates(resource) == updates + 1


def test_a_kind_discovered_later_gets_its_own_plugin_registered(
    start_daemon: StartDaemon, kubelet: FakeKubelet, script: Path
) -> None:
    start_daemon()
    kubelet.wait_for_registration("scripted.example/accel")
    legacy = [{"id": "LEG-0", "count": 2, "devmem": 1024}]
    write_script(script, {"Scripted": scripted_devices(2), "ScriptedLegacy": legacy})
    registration = kubelet.wait_for_registration("legacy.example/accel")
    assert registration.endpoint == "hami-legacy.example_accel.sock"
    assert [d.id for d in kubelet.wait_for_devices("legacy.example/accel")] == ["LEG-0-0", "LEG-0-1"]


def test_a_kubelet_restart_is_followed_by_a_new_registration_of_every_resource(
    start_daemon: StartDaemon, kubelet: FakeKubelet, script: Path
) -> None:
    write_script(script, {"Scripted": scripted_devices(1), "ScriptedCap": [{"id": "CAP-0", "devmem": 1024}]})
    start_daemon()
    names = {"scripted.example/accel", "cap.example/accel", "cap.example/accel-memory"}
    for name in names:
        kubelet.wait_for_registration(name)
    kubelet.restart()
    for name in names:
        assert kubelet.wait_for_registration(name).generation == 2
    assert len(kubelet.wait_for_devices("cap.example/accel-memory")) == 1


def test_the_lock_lease_is_offered_while_in_place_and_withdrawn_when_not(
    cluster: MemoryCluster, plugins: VendorPlugins
) -> None:
    offer: list[str | None] = ["hami-system/hami-node-lock-" + NODE]
    r = NodeRegistrar(cluster, plugins, NODE, lock_lease=lambda: offer[0])
    found = inventory("Scripted", Device(id="SCR-0", count=10, devmem=8192, type="Scripted-X"))
    assert r.sync(found)[LEASE_ANNOTATION] == offer[0]
    assert LEASE_ANNOTATION not in r.sync(found)  # unchanged: not written again
    offer[0] = None  # the Lease could not be kept (e.g. the API refused it)
    assert r.sync(found) == {LEASE_ANNOTATION: None}
    assert LEASE_ANNOTATION not in node_annotations(cluster, NODE)


def test_the_daemon_reads_its_lock_lease_until_it_is_in_place_not_at_every_node_sync(
    settings: NodeSettings, plugins: VendorPlugins
) -> None:
    """At 5,000 nodes a read per node sync would be 166 reads a second; once the Lease is in place, an Allocate that
    finds it gone (its owner's deletion took it) makes it again."""
    reads: list[str] = []

    class Counting(MemoryCluster):
        def get(self, resource: Any, name: str, namespace: str | None = None, *, recent: bool = False) -> Any:
            if resource == "leases":
                reads.append(name)
            return super().get(resource, name, namespace)

    cluster = Counting()
    cluster.create("nodes", {"metadata": {"name": NODE}})
    lease = DaemonLease(cluster, NODE, "hami-system")
    daemon = NodeDaemon(settings, plugins, cluster, lease=lease)
    for _ in range(3):
        daemon._node_work(sweep=False)
    assert (reads, lease.in_place) == ([LEASE_PREFIX + NODE], True)
    cluster.delete("leases", LEASE_PREFIX + NODE, "hami-system")
    assert lease.holder() is None
    assert cluster.get("leases", LEASE_PREFIX + NODE, "hami-system")["metadata"]["name"] == LEASE_PREFIX + NODE
