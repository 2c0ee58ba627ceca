"""MIG on the node: instances created through NVML at the reserved placement, reused, rolled back, destroyed
when the pod is gone; the fake NVML records what was asked of the hardware. Plus the accounting directory of
shared GPUs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.codec import (
    MigReservation,
    decode_mig_allocations,
    decode_node_register,
    encode_mig_allocations,
    encode_node_register,
)
from hami.errors import HamiError
from hami.model import Container, ContainerDevice, ContainerRequest, DeviceUsage, NodeView, Pod, SchedulingPolicy
from hami_vendor_nvidia.allocation import reservations_after
from hami_vendor_nvidia.fit import NvidiaFitter
from hami_vendor_nvidia.mig import MIG_ALLOCATIONS_ANNOTATION, MIG_INSTANCES_ANNOTATION

NodeFactory = Callable[..., Any]


def pod(reservations: list[MigReservation] | None = None, containers: int = 1, uid: str = "uid-mig") -> Pod:
    annotations = {"nvidia.com/vgpu-mode": "mig"}
    if reservations:
        annotations[MIG_ALLOCATIONS_ANNOTATION] = encode_mig_allocations(reservations)
    return Pod(
        name="trainer",
        uid=uid,
        annotations=annotations,
        containers=tuple(Container(name=f"c{i}") for i in range(containers)),
    )


def gpu(uuid: str, memory: int = 9856, cores: int = 28) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=memory, usedcores=cores)


def mig_calls(node: Any) -> list[tuple[str, Any, ...]]:
    out = []
    for call in node.calls():
        if call["call"] == "create_gpu_instance":
            out.append(("create", call["gpu"], call["profile"], call["start"], call["size"], call["result"]))
        elif call["call"] == "destroy_gpu_instance":
            out.append(("destroy", call["gpu"], call["start"], call["size"], call["result"]))
    return out


@pytest.fixture
def a100(gpu_node: NodeFactory, boxes: Any) -> Any:
    node = gpu_node(boxes.a100_mig())
    node.uuids = [d["uuid"] for d in node.box["devices"]]
    return node


def test_the_reserved_instance_is_created_at_exactly_its_placement(a100: Any) -> None:
    plugins = a100.plugins()
    gpu0 = a100.uuids[0]
    owner = pod([MigReservation(0, 0, gpu0, "2g.10gb", 2, 2)])
    (device,) = plugins.allocate("NVIDIA", owner, 0, (gpu(gpu0),)).devices
    assert device.uuid.startswith("MIG-")
    assert (device.usedmem, device.usedcores) == (9856, 28)
    assert mig_calls(a100) == [("create", gpu0, 1, 2, 2, 0)]  # profile 1 is NVML's 2g.10gb
    (ci,) = [c for c in a100.calls() if c["call"] == "create_compute_instance"]
    assert (ci["profile"], ci["uuid"]) == (1, device.uuid)  # one compute instance spanning the 2-slice instance

    edits = plugins.container_edits("NVIDIA", owner, 0, (device,))
    assert dict(edits.env) == {"NVIDIA_VISIBLE_DEVICES": device.uuid}
    assert edits.mounts == ()
    assert edits.cdi_devices == (f"nvidia.com/gpu={device.uuid}",)

    (done,) = decode_mig_allocations(reservations_after(plugins.vendor("nvidia").settings, owner) or "")
    assert (done.mig_uuid, done.gpu_instance_id, done.compute_instance_id) == (device.uuid, 1, 0)
    assert (done.gpu_uuid, done.profile, done.start, done.size) == (gpu0, "2g.10gb", 2, 2)


def test_a_repeated_allocate_reuses_the_instance(a100: Any) -> None:
    plugins = a100.plugins()
    owner = pod([MigReservation(0, 0, a100.uuids[0], "1g.10gb", 4, 2)])
    first = plugins.allocate("NVIDIA", owner, 0, (gpu(a100.uuids[0], cores=14),))
    again = plugins.allocate("NVIDIA", owner, 0, (gpu(a100.uuids[0], cores=14),))
    assert first == again
    assert len(mig_calls(a100)) == 1


def test_without_a_reservation_the_node_creates_what_the_scheduler_chose(a100: Any) -> None:
    plugins = a100.plugins()
    (inventory,) = plugins.discover()["nvidia"]
    view = NodeView(
        name="gpu-node",
        devices=[DeviceUsage(device=d) for d in decode_node_register(encode_node_register(inventory.devices))],
        annotations=dict(inventory.annotations),
    )
    owner = pod(containers=2)
    fitter = NvidiaFitter(plugin.KIND, owner, SchedulingPolicy(device=("binpack",)))
    request = ContainerRequest(kind="NVIDIA", count=1, memory=8000)
    result = fitter.fit_node([request, request], view)
    assert result.placement is not None
    chosen = [(c.gpu_uuid, c.placement.start, c.placement.size) for c in fitter.mig_choices["gpu-node"]]
    for index, devices in enumerate(result.placement):
        plugins.allocate("NVIDIA", owner, index, devices)
    created = [(uuid, start, size) for _, uuid, _, start, size, ok in mig_calls(a100) if ok == 0]
    assert created == chosen

    (after,) = plugins.discover()["nvidia"]  # the node reports the new instances; the scheduler places around them
    reported = json.loads(after.annotations[MIG_INSTANCES_ANNOTATION])
    assert sorted((i["gpuUUID"], i["placement"]["start"]) for i in reported) == sorted(
        [(uuid, start) for uuid, start, _ in chosen] + [(a100.uuids[1], 6)]
    )
    used = {uuid: sum(1 for u, _, _ in chosen if u == uuid) for uuid, _, _ in chosen}
    busy = NodeView(
        name="gpu-node",
        devices=[DeviceUsage(device=d, used=used.get(d.id, 0)) for d in after.devices],
        annotations=dict(after.annotations),
    )
    again = NvidiaFitter(plugin.KIND, pod(uid="uid-next"), SchedulingPolicy(device=("binpack",)))
    assert again.fit_node([request], busy).fits
    (next_choice,) = again.mig_choices["gpu-node"]
    assert all(not (next_choice.gpu_uuid == uuid and next_choice.placement.start == start) for uuid, start, _ in chosen)


def test_a_placement_taken_by_another_instance_is_refused_and_nothing_is_left_behind(a100: Any) -> None:
    plugins = a100.plugins()
    gpu0, gpu1 = a100.uuids
    owner = pod([MigReservation(0, 0, gpu0, "1g.5gb", 0, 1), MigReservation(0, 1, gpu1, "1g.5gb", 6, 1)])
    with pytest.raises(HamiError, match=r"placement 6\+1 of GPU .* is taken by MIG instance MIG-"):
        plugins.allocate("NVIDIA", owner, 0, (gpu(gpu0, 4864, 14), gpu(gpu1, 4864, 14)))
    assert mig_calls(a100) == [("create", gpu0, 0, 0, 1, 0), ("destroy", gpu0, 0, 1, 0)]  # rolled back


def test_a_reservation_of_a_profile_the_gpu_does_not_allow_is_refused(a100: Any) -> None:
    plugins = a100.plugins(migProfileAllowlist=[{"models": ["A100"], "profiles": ["1g.10gb"]}])
    owner = pod([MigReservation(0, 0, a100.uuids[0], "3g.20gb", 0, 4)])
    with pytest.raises(HamiError, match=r"reserves MIG profile 3g\.20gb .*\(allowed: 1g\.10gb\)"):
        plugins.allocate("NVIDIA", owner, 0, (gpu(a100.uuids[0], 19968, 42),))
    assert mig_calls(a100) == []


def test_release_destroys_the_pods_instances_once(a100: Any) -> None:
    plugins = a100.plugins()
    gpu0 = a100.uuids[0]
    owner = pod([MigReservation(0, 0, gpu0, "3g.20gb", 4, 4)])
    placement = plugins.allocate("NVIDIA", owner, 0, (gpu(gpu0, 19968, 42),)).devices
    plugins.release("NVIDIA", owner, [placement])
    plugins.release("NVIDIA", owner, [placement])  # a second release finds nothing to do
    assert mig_calls(a100) == [("create", gpu0, 2, 4, 4, 0), ("destroy", gpu0, 4, 4, 0)]
    (inventory,) = plugins.discover()["nvidia"]
    assert gpu0 not in inventory.annotations[MIG_INSTANCES_ANNOTATION]


def test_release_finds_instances_by_their_recorded_identity_after_a_restart(a100: Any) -> None:
    first = a100.plugins()
    gpu0 = a100.uuids[0]
    owner = pod([MigReservation(0, 0, gpu0, "1g.10gb", 0, 2)])
    placement = first.allocate("NVIDIA", owner, 0, (gpu(gpu0, cores=14),)).devices
    written = reservations_after(first.vendor("nvidia").settings, owner)
    assert written is not None
    restarted = a100.plugins()  # a new daemon: it knows the instance only from the pod's annotation
    finished = owner.model_copy(update={"annotations": {**owner.annotations, MIG_ALLOCATIONS_ANNOTATION: written}})
    restarted.release("NVIDIA", finished, [placement])
    assert mig_calls(a100)[-1] == ("destroy", gpu0, 0, 2, 0)


def test_an_instance_still_in_use_is_kept_for_a_later_release(a100: Any, caplog: pytest.LogCaptureFixture) -> None:
    plugins = a100.plugins()
    gpu1 = a100.uuids[1]
    (inventory,) = plugins.discover()["nvidia"]
    (existing,) = json.loads(inventory.annotations[MIG_INSTANCES_ANNOTATION])
    held = MigReservation(0, 0, gpu1, "1g.5gb", 6, 1, existing["migUUID"], 1, 0)
    with caplog.at_level(logging.WARNING, logger="hami_vendor_nvidia"):
        plugins.release("NVIDIA", pod([held]), [(gpu(existing["migUUID"]),)])
    assert "is still in use, it will be destroyed later" in caplog.text
    (after,) = plugins.discover()["nvidia"]
    assert existing["migUUID"] in after.annotations[MIG_INSTANCES_ANNOTATION]


def test_release_of_a_pod_never_allocated_does_nothing(a100: Any) -> None:
    a100.plugins().release("NVIDIA", pod(), [()])
    assert a100.calls() == []


def test_shared_gpus_get_a_fresh_accounting_directory_that_release_removes(gpu_node: NodeFactory, boxes: Any) -> None:
    node = gpu_node(boxes.mixed())
    plugins = node.plugins()
    owner = Pod(name="web", uid="uid-web", containers=(Container(name="app"),))
    t4 = node.box["devices"][0]["uuid"]
    devices = (ContainerDevice(uuid=t4, type="NVIDIA", usedmem=3000, usedcores=30),)
    directory = Path(node.config()["hookPath"]) / "vgpu" / "containers" / "uid-web_app"
    directory.mkdir(parents=True)
    (directory / "stale.cache").write_text("from a previous container")
    assert plugins.allocate("NVIDIA", owner, 0, devices).devices == devices
    assert directory.is_dir()
    assert not any(directory.iterdir())
    assert directory.stat().st_mode & 0o777 == 0o777
    plugins.release("NVIDIA", owner, [devices])
    assert not directory.exists()


def test_a_gpu_in_mig_mode_is_kept_out_of_the_dra_slice_and_the_others_are_published(
    gpu_node: Callable[..., Any], boxes: Any
) -> None:
    from hami.dra.slices import build_slice

    plugins = gpu_node(boxes.a100_mig()).plugins()
    inventories = {inv.kind: inv for inv in plugins.discover()["nvidia"]}
    devices = inventories["NVIDIA"].devices
    published = [
        d["attributes"]["uuid"]["string"] for d in build_slice(plugins, "n", "hami.io", inventories)["spec"]["devices"]
    ]
    assert published == [d.id for d in devices if d.mode != "mig"]
    assert any(d.mode == "mig" for d in devices)
