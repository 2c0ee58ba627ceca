"""The DRA kubelet plugin, called as the kubelet calls it: registration and NodePrepareResources /
NodeUnprepareResources over its unix sockets, claims read from the API, edits from the vendor's hooks in CDI
spec files, and one accounting with the device-plugin path."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import scripted_vendor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_harness import NODE, scripted_devices, write_script

from hami.cluster import MemoryCluster
from hami.codec import encode_pod_devices
from hami.dra.claims import ClaimError, claim_shares
from hami.dra.plugin import ClaimRef, DraPlugin
from hami.dra.proto import dra_pb2 as pb
from hami.dra.proto import dra_pb2_grpc as pb_grpc
from hami.dra.proto import pluginregistration_pb2 as reg
from hami.dra.proto import pluginregistration_pb2_grpc as reg_grpc
from hami.dra.slices import SlicePublisher, published_devices
from hami.model import ContainerDevice
from hami.plugins import VendorPlugins
from hami.signing import SIGNATURE_ANNOTATION, PlacementKeys, SignedPlacement

DRIVER = "hami.io"
ALLOCATED = scripted_vendor.SCRIPTED.annotations.allocated


class Loop:
    """An event loop in a thread, as the daemon runs the plugin's servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[dict[str, Any]]:
    scripted_vendor.RELEASED.clear()
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2, count=3, devmem=8192)})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": NODE, "uid": "n-1"}})
    publisher = SlicePublisher(cluster, plugins, NODE, DRIVER)
    publisher.sync({inv.kind: inv for inv in plugins.discover()["scripted"]})
    plugin = DraPlugin(
        cluster, plugins, NODE, DRIVER, lambda: publisher.devices,
        plugin_dir=tmp_path / "plugins", registry_dir=tmp_path / "registry", cdi_dir=tmp_path / "cdi",
    )  # fmt: skip
    loop = Loop()
    loop.run(plugin.start())
    channel = grpc.insecure_channel(f"unix://{plugin.socket_path}")
    try:
        yield {"cluster": cluster, "plugin": plugin, "stub": pb_grpc.DRAPluginStub(channel), "tmp": tmp_path,
               "script": script, "loop": loop}  # fmt: skip
    finally:
        channel.close()
        loop.run(plugin.stop(0))
        loop.close()


def _claim(cluster: MemoryCluster, name: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A claim as kube-scheduler leaves it: allocated, with the consumed capacity of each share."""
    claim = cluster.create(
        "resourceclaims",
        {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "scripted.hami.io"}}]}}},
    )  # fmt: skip
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": NODE, **r} for r in results
    ]}}}  # fmt: skip
    return cluster.replace("resourceclaims", claim)


def _share(device: str, memory: str, cores: str, share: str = "s-1") -> dict[str, Any]:
    return {"device": device, "shareID": share, "consumedCapacity": {"memory": memory, "cores": cores, "shares": "1"}}


def _prepare(stub: Any, *names: str) -> Any:
    return stub.NodePrepareResources(
        pb.NodePrepareResourcesRequest(claims=[pb.Claim(namespace="team", name=n, uid=f"uid-{n}") for n in names]),
        timeout=30,
    )


def test_registration_tells_the_kubelet_the_driver_and_its_service(world: dict[str, Any]) -> None:
    plugin: DraPlugin = world["plugin"]
    assert plugin.registration_path == world["tmp"] / "registry" / "hami.io-reg.sock"
    with grpc.insecure_channel(f"unix://{plugin.registration_path}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = stub.GetInfo(reg.InfoRequest(), timeout=10)
        assert (info.type, info.name, info.endpoint) == ("DRAPlugin", DRIVER, str(plugin.socket_path))
        assert list(info.supported_versions) == ["v1.DRAPlugin"]
        stub.NotifyRegistrationStatus(reg.RegistrationStatus(plugin_registered=True), timeout=10)
    assert plugin.registered


def test_a_share_is_prepared_into_a_cdi_device_carrying_the_vendors_edits(world: dict[str, Any]) -> None:
    _claim(world["cluster"], "small", [_share("scripted-1", "2Gi", "30")])
    answer = _prepare(world["stub"], "small").claims["uid-small"]
    assert answer.error == ""
    [device] = answer.devices
    assert (device.pool_name, device.device_name, list(device.request_names)) == (NODE, "scripted-1", ["gpu"])
    assert device.share_id == "s-1"
    assert list(device.cdi_device_ids) == ["hami.io/claim=uid-small-scripted", "scripted.example/accel=SCR-1"]
    spec = json.loads((world["tmp"] / "cdi" / "hami.io-claim_uid-small.json").read_text())
    assert spec["cdiVersion"] == "0.6.0"
    assert spec["kind"] == "hami.io/claim"
    [cdi] = spec["devices"]
    assert cdi["name"] == "uid-small-scripted"
    env = dict(e.split("=", 1) for e in cdi["containerEdits"]["env"])
    # the consumed capacity is what the container is limited to: 2 GiB and 30 % of SCR-1
    assert env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert env["SCRIPTED_MEMORY_LIMIT_0"] == "2048m"
    assert env["SCRIPTED_CORE_LIMIT"] == "30"
    nodes = cdi["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/scr-1", "hostPath": "/dev/scr-1", "permissions": "rw"}]
    # the kubelet asks again (a restart): the same answer, the vendor not asked again
    again = _prepare(world["stub"], "small").claims["uid-small"]
    assert again == answer


def test_unprepare_releases_through_the_vendor_and_removes_the_spec(world: dict[str, Any]) -> None:
    _claim(world["cluster"], "small", [_share("scripted-0", "1Gi", "10")])
    assert _prepare(world["stub"], "small").claims["uid-small"].error == ""
    done = world["stub"].NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace="team", name="small", uid="uid-small")]), timeout=30
    )
    assert done.claims["uid-small"].error == ""
    assert scripted_vendor.RELEASED == [("Scripted", "small", 1)]
    assert not (world["tmp"] / "cdi" / "hami.io-claim_uid-small.json").exists()
    assert not world["plugin"].prepared()
    # unknown claims are already unprepared
    done = world["stub"].NodeUnprepareResources(
        pb.NodeUnprepareResourcesRequest(claims=[pb.Claim(namespace="team", name="x", uid="uid-x")]), timeout=30
    )
    assert done.claims["uid-x"].error == ""


def test_a_device_the_extender_gave_to_a_pod_is_not_prepared_beyond_what_is_left(world: dict[str, Any]) -> None:
    cluster: MemoryCluster = world["cluster"]
    placed = encode_pod_devices([(ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=6144, usedcores=50),)])
    cluster.create("pods", {
        "metadata": {"name": "dp-pod", "namespace": "team", "annotations": {ALLOCATED: placed}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}, "status": {"phase": "Running"},
    })  # fmt: skip
    _claim(cluster, "big", [_share("scripted-0", "4Gi", "10")])
    _claim(cluster, "fits", [_share("scripted-0", "2Gi", "50", "s-2")])
    _claim(cluster, "cores", [_share("scripted-0", "1Mi", "1", "s-3")])
    answers = _prepare(world["stub"], "big", "fits", "cores").claims
    assert "2048 MiB free beside pod team/dp-pod" in answers["uid-big"].error
    assert not answers["uid-big"].devices
    assert answers["uid-fits"].error == ""
    # SCR-0 now has 8 GiB and 100 % held (the pod's and claim fits'): nothing more
    assert "0 MiB free" in answers["uid-cores"].error


def test_the_split_count_bounds_claims_and_pods_together(world: dict[str, Any]) -> None:
    cluster: MemoryCluster = world["cluster"]
    placed = encode_pod_devices([(ContainerDevice(uuid="SCR-1", type="Scripted", usedmem=100, usedcores=0),)])
    cluster.create("pods", {
        "metadata": {"name": "dp", "namespace": "team", "annotations": {ALLOCATED: placed}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]},
    })  # fmt: skip
    for i in range(3):
        _claim(cluster, f"c{i}", [_share("scripted-1", "100Mi", "0", f"s-{i}")])
    answers = _prepare(world["stub"], "c0", "c1", "c2").claims
    assert [answers[f"uid-c{i}"].error == "" for i in range(3)] == [True, True, False]
    assert "all its 3 shares held" in answers["uid-c2"].error


def test_a_claim_that_is_not_what_the_kubelet_names_is_refused(world: dict[str, Any]) -> None:
    cluster: MemoryCluster = world["cluster"]
    claim = _claim(cluster, "moved", [_share("scripted-0", "1Gi", "0")])
    claim["status"]["allocation"]["devices"]["results"][0]["device"] = "scripted-9"
    cluster.replace("resourceclaims", claim)
    answers = _prepare(world["stub"], "moved", "absent").claims
    assert "scripted-9 is not published by node node-a" in answers["uid-moved"].error
    assert "does not exist" in answers["uid-absent"].error
    cluster.create("resourceclaims", {"metadata": {"name": "recreated", "namespace": "team", "uid": "other"}})
    assert "it was deleted and created again" in _prepare(world["stub"], "recreated").claims["uid-recreated"].error


def test_a_whole_device_takes_all_its_memory_and_cores(world: dict[str, Any]) -> None:
    devices = scripted_devices(2, count=1)
    write_script(world["script"], {"Scripted": devices})
    plugin: DraPlugin = world["plugin"]
    publisher = SlicePublisher(world["cluster"], plugin.plugins, NODE, DRIVER)
    publisher.sync({inv.kind: inv for inv in plugin.plugins.discover()["scripted"]})
    plugin.devices = lambda: publisher.devices
    _claim(world["cluster"], "whole", [{"device": "scripted-0"}])
    assert _prepare(world["stub"], "whole").claims["uid-whole"].error == ""
    [placement] = plugin.prepared()[0].placements.values()
    assert placement == (ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=8192, usedcores=100),)
    _claim(world["cluster"], "second", [{"device": "scripted-0"}])
    refused = _prepare(world["stub"], "second").claims["uid-second"].error
    assert "is not shared and is held by claim team/whole" in refused


def test_two_shares_of_one_device_in_one_claim_are_refused(world: dict[str, Any]) -> None:
    _claim(
        world["cluster"], "twice", [_share("scripted-0", "1Gi", "0", "s-1"), _share("scripted-0", "1Gi", "0", "s-2")]
    )
    refused = _prepare(world["stub"], "twice").claims["uid-twice"].error
    assert "two shares of device scripted-0" in refused
    assert "distinctAttribute: hami.io/uuid" in refused


def test_a_tenant_erasing_its_served_pods_annotations_does_not_free_its_device(tmp_path: Path) -> None:
    """The tenant owns its pod's annotations; the daemon's own record of what it served is what counts."""
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(1, count=3, devmem=8192)})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    cluster = MemoryCluster()
    cluster.create("pods", {
        "metadata": {"name": "tenant", "namespace": "team", "uid": "tenant-uid", "annotations": {}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}, "status": {"phase": "Running"},
    })  # fmt: skip
    publisher = SlicePublisher(cluster, plugins, NODE, DRIVER)
    publisher.sync({inv.kind: inv for inv in plugins.discover()["scripted"]})
    served = [("pod team/tenant", "tenant-uid", (ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=7000),))]
    plugin = DraPlugin(
        cluster, plugins, NODE, DRIVER, lambda: publisher.devices, served=lambda: served,
        plugin_dir=tmp_path / "p", registry_dir=tmp_path / "r", cdi_dir=tmp_path / "cdi",
    )  # fmt: skip
    _claim(cluster, "grab", [_share("scripted-0", "2Gi", "0")])
    with pytest.raises(ClaimError, match="1192 MiB free beside pod team/tenant"):
        plugin.prepare(ClaimRef("team", "grab", "uid-grab"))


def test_under_signing_a_pending_pod_counts_by_its_signed_placement(tmp_path: Path) -> None:
    directory = tmp_path / "keys"
    directory.mkdir()
    (directory / "current").write_bytes(b"k" * 32)
    keys = PlacementKeys.from_directory(directory)
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(1, count=3, devmem=8192)})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    cluster = MemoryCluster()
    signed = encode_pod_devices([(ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=7000),)])
    signature = keys.sign(SignedPlacement("pending-uid", NODE, {ALLOCATED: signed}))
    # the owner rewrote the placement to hold nothing; the signature still says 7000 MiB
    forged = encode_pod_devices([(ContainerDevice(uuid="SCR-0", type="Scripted", usedmem=0),)])
    cluster.create("pods", {
        "metadata": {"name": "pending", "namespace": "team", "uid": "pending-uid",
                     "annotations": {ALLOCATED: forged, SIGNATURE_ANNOTATION: signature}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]}, "status": {"phase": "Pending"},
    })  # fmt: skip
    publisher = SlicePublisher(cluster, plugins, NODE, DRIVER)
    publisher.sync({inv.kind: inv for inv in plugins.discover()["scripted"]})
    plugin = DraPlugin(
        cluster, plugins, NODE, DRIVER, lambda: publisher.devices, placement_keys=keys,
        plugin_dir=tmp_path / "p", registry_dir=tmp_path / "r", cdi_dir=tmp_path / "cdi",
    )  # fmt: skip
    _claim(cluster, "grab", [_share("scripted-0", "2Gi", "0")])
    with pytest.raises(ClaimError, match="1192 MiB free beside pod team/pending"):
        plugin.prepare(ClaimRef("team", "grab", "uid-grab"))


def test_a_removed_socket_is_served_again(world: dict[str, Any]) -> None:
    """The kubelet cleans its plugin directories when it restarts; the daemon's kubelet poll listens again."""
    plugin: DraPlugin = world["plugin"]
    plugin.registration_path.unlink()
    plugin.socket_path.unlink()
    world["loop"].run(plugin.ensure_listening())
    with grpc.insecure_channel(f"unix://{plugin.registration_path}") as channel:
        info = reg_grpc.RegistrationStub(channel).GetInfo(reg.InfoRequest(), timeout=10)
    assert info.endpoint == str(plugin.socket_path)
    _claim(world["cluster"], "after", [_share("scripted-0", "1Gi", "0")])
    with grpc.insecure_channel(f"unix://{plugin.socket_path}") as channel:
        assert _prepare(pb_grpc.DRAPluginStub(channel), "after").claims["uid-after"].error == ""


claim_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)
result_values = st.fixed_dictionaries(
    {},
    optional={
        "driver": st.just(DRIVER) | st.text(max_size=8),
        "pool": st.just(NODE) | claim_values,
        "device": st.sampled_from(["scripted-0", "scripted-1", "x"]) | claim_values,
        "request": claim_values,
        "shareID": claim_values,
        "consumedCapacity": st.dictionaries(
            st.sampled_from(["hami.io/memory", "hami.io/cores", "memory", "other"]),
            st.sampled_from(["1Gi", "-1", "50", "1e3", "x", "0.5"]) | claim_values,
            max_size=3,
        )
        | claim_values,
    },
)


@given(status=st.fixed_dictionaries({}, optional={"allocation": claim_values | st.fixed_dictionaries(
    {"devices": st.fixed_dictionaries({"results": st.lists(result_values | claim_values, max_size=3)})})}))  # fmt: skip
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_claim_status_is_read_or_refused_with_a_reason(tmp_path: Path, status: dict[str, Any]) -> None:
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2)})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    devices = {p.name: p for p in published_devices(plugins, {i.kind: i for i in plugins.discover()["scripted"]})}
    claim = {"metadata": {"name": "c", "namespace": "n", "uid": "u"}, "status": status}
    try:
        shares = claim_shares(claim, DRIVER, NODE, devices)
    except ClaimError as exc:
        reason = str(exc)
        shares = []
    else:
        reason = ""
        assert shares
    assert reason or shares
    assert all(s.placement.usedmem >= 0 for s in shares)
    assert all(s.placement.usedcores >= 0 for s in shares)
