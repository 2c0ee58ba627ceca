"""A MetaX sGPU share through the real path, on a node of two C500 cards linked by MetaXLink.

The node runs `hami node` with the MetaX plugin reading the MetaX package's own fake MXSML library
(vendors/metax/tests/fake_mxsml, `libmxsml.so` answering its documented calls from a machine file), exactly as it
would read MetaX's: nothing about the cards is written for the daemon. The daemon registers the cards as MetaX's
sGPU plugin does (`metax-tech.com/node-gpu-devices`), the scheduler reads that annotation, the webhook writes
HAMi's default QoS policy, the placement carries MetaX's own annotations, the container gets the card's device
nodes, and the node's annotation shows the share taken while the pod runs and given back after it is deleted.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_plane import ROOT, wait_until, which_cc
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorHost

pytestmark = pytest.mark.e2e

FAKE_MXSML = ROOT / "vendors" / "metax" / "tests" / "fake_mxsml" / "fake_mxsml.c"
UUIDS = ["GPU-e702f06b-bbd6-bc06-5196-90a5554a24ba", "GPU-e702f06b-bbd6-bc06-5196-90a5554a24bb"]
ANNOTATION = "metax-tech.com/node-gpu-devices"


def _build(directory: Path) -> str:
    cc = which_cc()
    if cc is None:
        pytest.skip("no C compiler to build the MetaX fake libmxsml.so")
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "libmxsml.so"
    argv = [cc, "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-o", str(target), str(FAKE_MXSML)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return str(target)


@pytest.fixture(scope="module")
def metax_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "metax" not in {v.name for v in VendorHost.load().vendors}:
        pytest.skip("the MetaX vendor plugin (hami-vendor-metax) is not installed")
    root = stack.dir / "nodes" / "metax-node-1"
    library = _build(root / "fake-mxsml")
    machine = root / "machine.txt"
    # bdf uuid name vram-total-KB vram-used-KB state metalink-group (fake_mxsml.c's format)
    machine.write_text("".join(f"0000:{16 + i:02x}:00.0 {u} MXC500 {64 << 20} 0 1 1\n" for i, u in enumerate(UUIDS)))
    for i in range(len(UUIDS)):
        pci = root / "sys" / "bus" / "pci" / "devices" / f"0000:{16 + i:02x}:00.0"
        (pci / "drm" / f"card{i + 1}").mkdir(parents=True, exist_ok=True)
        (pci / "drm" / f"renderD{128 + i}").mkdir(exist_ok=True)
        (pci / "numa_node").write_text("0\n")
    settings = {
        "mxsmlLibrary": library,
        "mxSmi": str(root / "no-mx-smi"),
        "sysfsRoot": str(root / "sys"),
        "hookPath": str(root / "metax"),
    }
    node = DeviceNode(
        stack, "metax-node-1", {"metax": settings}, {"FAKE_MXSML_CONFIG": str(machine)},
        {"metax-tech.com/sgpu": None}, (ANNOTATION,),
    )  # fmt: skip
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


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
