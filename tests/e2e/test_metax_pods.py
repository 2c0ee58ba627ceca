"""A MetaX sGPU share through the real path, on a node of two C500 cards linked by MetaXLink.

The nodes run `hami node` with the MetaX plugin reading the MetaX package's own fake MXSML library
(vendors/metax/tests/fake_mxsml, `libmxsml.so` answering its documented calls from a machine file), exactly as it
would read MetaX's: nothing about the cards is written for the daemon. The daemon registers the cards as MetaX's
sGPU plugin does (`metax-tech.com/node-gpu-devices`), the scheduler reads that annotation, the webhook writes
HAMi's default QoS policy, the placement carries MetaX's own annotations, the container gets the card's device
nodes, and the node's annotation shows the share taken while the pod runs and given back after it is deleted. A
second node in `sgpuMode: hami-core` serves a share through the isolation library `libvmaca.so` the daemon installed,
with the grant file the daemon writes.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_MXSML = ROOT / "vendors" / "metax" / "tests" / "fake_mxsml" / "fake_mxsml.c"
UUIDS = ["GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba", "GPU-e702f06b-bbd6-bc06-5196-90a5554a24bb"]
SOFT_UUIDS = ["GPU-e702f06b-bbd6-bc06-5196-90a5554a24c0"]
ANNOTATION = "metax-tech.com/node-gpu-devices"


def _build(directory: Path) -> str:
    return str(build_fake_library(FAKE_MXSML, directory / "libmxsml.so"))


def _node(stack: HamiStack, name: str, uuids: list[str], **extra: str) -> DeviceNode:
    if "metax" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the MetaX vendor plugin (hami-vendor-metax) is not installed")
    root = stack.dir / "nodes" / name
    library = _build(root / "fake-mxsml")
    machine = root / "machine.txt"
    # bdf uuid name vram-total-KB vram-used-KB state metalink-group (fake_mxsml.c's format)
    machine.write_text("".join(f"0000:{16 + i:02x}:00.0 {u} MXC500 {64 << 20} 0 1 1\n" for i, u in enumerate(uuids)))
    for i in range(len(uuids)):
        pci = root / "sys" / "bus" / "pci" / "devices" / f"0000:{16 + i:02x}:00.0"
        (pci / "drm" / f"card{i + 1}").mkdir(parents=True, exist_ok=True)
        (pci / "drm" / f"renderD{128 + i}").mkdir(exist_ok=True)
        (pci / "numa_node").write_text("0\n")
    settings = {
        "mxsmlLibrary": library,
        "mxSmi": str(root / "no-mx-smi"),
        "sysfsRoot": str(root / "sys"),
        "hookPath": str(root / "metax"),
        **extra,
    }
    node = DeviceNode(
        stack, name, {"metax": settings}, {"FAKE_MXSML_CONFIG": str(machine)}, {"metax-tech.com/sgpu": None},
        (ANNOTATION,),
    )  # fmt: skip
    stack.add_node(node)
    return node


def _remove(stack: HamiStack, node: DeviceNode) -> None:
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


@pytest.fixture(scope="module")
def metax_node(stack: HamiStack) -> Iterator[DeviceNode]:
    node = _node(stack, "metax-node-1", UUIDS)
    yield node
    _remove(stack, node)


@pytest.fixture(scope="module")
def soft_node(stack: HamiStack) -> Iterator[DeviceNode]:
    node = _node(stack, "metax-node-2", SOFT_UUIDS, sgpuMode="hami-core")
    yield node
    _remove(stack, node)


def _cards(stack: HamiStack, node: DeviceNode) -> dict[str, dict[str, Any]]:
    annotations = stack.admin.get("Node", node.name)["metadata"].get("annotations") or {}
    return {e["uuid"]: e for e in json.loads(annotations.get(ANNOTATION, "[]"))}


def test_an_sgpu_share_is_placed_served_and_given_back(stack: HamiStack, metax_node: DeviceNode, ns: str) -> None:
    api = stack.admin
    assert {e["linkZone"] for e in _cards(stack, metax_node).values()} == {1}
    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "8", "metax-tech.com/vcore": "30"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "maca", "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "maca-pytorch", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", "maca", ns)
        return got if got["status"].get("phase") == "Running" else None

    def describe() -> str:
        got = api.get("Pod", "maca", ns)
        events = [f"{e['reason']}: {e['message']}" for e in api.events_about(ns, "maca")]
        return f"pod: {got['metadata']}\nstatus: {got['status']}\nevents: {events}\n{stack.diagnose()}"

    got = wait_until(running, 60, "the MetaX pod Running", describe)
    assert got["spec"]["nodeName"] == metax_node.name
    annotations = got["metadata"]["annotations"]
    assert annotations["metax-tech.com/sgpu-qos-policy"] == "best-effort"  # HAMi's admission default
    ((device,),) = decode_pod_devices(annotations["hami.io/metax-sgpu-devices-allocated"])
    assert device.uuid in UUIDS
    assert (device.type, device.usedmem, device.usedcores) == ("Metax-SGPU", 8192, 30)
    assert json.loads(annotations["metax-tech.com/gpu-devices-allocated"]) == [
        [{"uuid": device.uuid, "compute": 30, "vRam": 8192}]
    ]
    assert int(annotations["metax-tech.com/predicate-time"]) > 0
    index = UUIDS.index(device.uuid)
    served = metax_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["main"]["metax-tech.com/sgpu"]
    assert [d.host_path for d in edits.devices] == ["/dev/mxcd", f"/dev/dri/card{index + 1}",
                                                    f"/dev/dri/renderD{128 + index}"]  # fmt: skip
    assert edits.env == {"METAX_VISIBLE_DEVICES": str(index), "MACA_VISIBLE_DEVICES": "0"}
    assert {m.container_path for m in edits.mounts} == {"/opt/mxdriver", "/opt/maca"}

    # the node publishes the share taken, as MetaX's plugin does, and its metrics carry the cards and the share
    def taken() -> dict[str, Any] | None:
        card = _cards(stack, metax_node)[device.uuid]
        return card if card.get("availableCompute") == 70 else None

    card = wait_until(taken, 30, "the share in metax-tech.com/node-gpu-devices", describe)
    assert (card["availableDevCount"], card["availableVRam"], card["qosPolicy"]) == (15, 65536 - 8192, "best-effort")
    with urllib.request.urlopen(f"http://127.0.0.1:{metax_node.metrics_port}/metrics", timeout=5) as response:
        metrics = response.read().decode()
    for uuid in UUIDS:
        assert f'device_uuid="{uuid}"' in metrics
    limit = next(line for line in metrics.splitlines() if line.startswith("hami_vgpu_memory_limit_bytes{"))
    assert f'device_uuid="{device.uuid}"' in limit
    assert float(limit.rsplit(" ", 1)[1]) == 8192 << 20

    api.delete("Pod", "maca", ns)
    wait_until(lambda: _cards(stack, metax_node)[device.uuid].get("availableCompute") == 100 or None, 60,
               "the share given back after the pod was deleted", describe)  # fmt: skip


def test_in_soft_mode_a_share_gets_libvmaca_and_its_grant(stack: HamiStack, soft_node: DeviceNode, ns: str) -> None:
    api = stack.admin
    limits = {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4", "metax-tech.com/vcore": "25"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "soft", "namespace": ns, "annotations": {"metax-tech.com/use-gpuuuid": SOFT_UUIDS[0]}},
            "spec": {"containers": [{"name": "main", "image": "maca-pytorch", "resources": {"limits": limits}}]},
        }
    )

    def describe() -> str:
        got = api.get("Pod", "soft", ns)
        events = [f"{e['reason']}: {e['message']}" for e in api.events_about(ns, "soft")]
        return f"pod: {got['metadata']}\nstatus: {got['status']}\nevents: {events}\n{stack.diagnose()}"

    got = wait_until(
        lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(api.get("Pod", "soft", ns)),
        60, "the soft-mode MetaX pod Running", describe,
    )  # fmt: skip
    assert got["spec"]["nodeName"] == soft_node.name
    edits = soft_node.kubelet.started[got["metadata"]["uid"]].edits["main"]["metax-tech.com/sgpu"]
    assert edits.env["MACA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert edits.env["MACA_DEVICE_CORE_LIMIT_0"] == "25"
    assert edits.env["MACA_DEVICE_UUIDS"] == SOFT_UUIDS[0]
    preload = next(m for m in edits.mounts if m.container_path == "/etc/ld.so.preload")
    library = Path(preload.host_path).read_text().strip()
    assert Path(library).name == "libvmaca.so"
    assert any(m.container_path == library for m in edits.mounts)
    grant = next(m for m in edits.mounts if m.container_path == "/etc/hami/grant")
    text = (Path(grant.host_path) / "metax.grant").read_text()
    assert str(4096 << 20) in text
    accounting = Path(next(m for m in edits.mounts if m.container_path == "/hami-vmaca-shmem").host_path)
    assert accounting.is_dir()

    api.delete("Pod", "soft", ns)
    wait_until(lambda: not accounting.exists() or None, 60, "the accounting directory removed with the pod", describe)
