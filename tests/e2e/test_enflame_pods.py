"""Enflame GCUs through the real path: whole cards served by `hami node`, DRS partitions placed for Enflame's plugin.

The node runs `hami node` with the Enflame plugin reading the Enflame package's own fake EFML
(vendors/enflame/tests/fake_efml, a `libefml.so` answering efml.h's calls from a machine file), exactly as it
would read the real library. A whole-card pod is placed by the scheduler (HAMi's ``hami.io/enflame-gcu-devices-*``
annotations) and served by Allocate with Enflame's container edits. A DRS pod is placed on the cards Enflame's DRS
device plugin publishes (``enflame.com/gcu-drs-capacity``, written here as that plugin writes it) with HAMi's
annotations for that plugin; creating the instance and serving the container is that plugin's part, as in HAMi.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_EFML = ROOT / "vendors" / "enflame" / "tests" / "fake_efml" / "fake_efml.c"
UUIDS = ["TR1V57100500", "TR1V57100501"]
DRS_CAPACITY = json.dumps({"devices": [{"index": "0", "minor": "0", "capacity": 6}, {"index": "1", "minor": "1",
                           "capacity": 6}], "profiles": {"1g.6gb": "0", "3g.20gb": "1", "6g.40gb": "2"}})  # fmt: skip


@pytest.fixture(scope="module")
def enflame_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "enflame" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the Enflame vendor plugin (hami-vendor-enflame) is not installed")
    root = stack.dir / "nodes" / "enflame-node-1"
    library = build_fake_library(FAKE_EFML, root / "efml" / "libefml.so")
    machine = root / "efml.machine"
    # uuid name memory-MiB health pci numa (fake_efml.c's format)
    machine.write_text("".join(f"{u} S60 42976 1 0000:b{i}:00.0 0\n" for i, u in enumerate(UUIDS)))
    node = DeviceNode(
        stack,
        "enflame-node-1",
        {"enflame": {"efmlLibrary": str(library), "efsmi": str(root / "no-efsmi")}},
        {"FAKE_EFML_CONFIG": str(machine)},
        {"enflame.com/gcu": "2"},
        ("hami.io/node-enflame-gcu-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


def _create(stack: HamiStack, ns: str, name: str, limits: dict[str, str]) -> None:
    stack.admin.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "tops", "image": "topsrider", "resources": {"limits": limits}}]},
        }
    )


def _describe(stack: HamiStack, ns: str, name: str) -> str:
    got = stack.admin.get("Pod", name, ns)
    events = [f"{e['reason']}: {e['message']}" for e in stack.admin.events_about(ns, name)]
    return f"pod: {got['metadata']}\nspec: {got['spec']}\nstatus: {got['status']}\nevents: {events}\n" + (
        stack.diagnose()
    )


def test_a_whole_gcu_runs_with_hamis_annotations_and_enflames_env(
    stack: HamiStack, enflame_node: DeviceNode, ns: str
) -> None:
    _create(stack, ns, "gcu", {"enflame.com/gcu": "1"})

    def running() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", "gcu", ns)
        return got if got["status"].get("phase") == "Running" else None

    got = wait_until(running, 60, "the Enflame pod Running", lambda: _describe(stack, ns, "gcu"))
    assert got["spec"]["nodeName"] == enflame_node.name
    annotations = got["metadata"]["annotations"]
    ((device,),) = decode_pod_devices(annotations["hami.io/enflame-gcu-devices-allocated"])
    assert device.uuid in UUIDS
    assert (device.type, device.usedmem, device.usedcores) == ("GCU", 42976, 100)
    index = UUIDS.index(device.uuid)
    served = enflame_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["tops"]["enflame.com/gcu"]
    assert dict(edits.env) == {"ENFLAME_VISIBLE_DEVICES": str(index)}
    assert [d.host_path for d in edits.devices] == [f"/dev/gcu{index}", "/dev/gcuctl"]
    stack.admin.delete("Pod", "gcu", ns)


def test_a_drs_pod_is_placed_with_hamis_annotations_for_enflames_drs_plugin(
    stack: HamiStack, enflame_node: DeviceNode, ns: str
) -> None:
    stack.admin.merge_patch("Node", enflame_node.name, {"metadata": {"annotations": {"enflame.com/gcu-drs-capacity":
                                                                               DRS_CAPACITY}}})  # fmt: skip
    _create(stack, ns, "drs", {"enflame.com/gcu-memory": "20480", "enflame.com/gcu-core": "40"})

    def placed() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", "drs", ns)
        return got if got["spec"].get("nodeName") else None

    got = wait_until(placed, 60, "the DRS pod bound", lambda: _describe(stack, ns, "drs"))
    annotations = got["metadata"]["annotations"]
    assert got["spec"]["nodeName"] == enflame_node.name
    assert "hami.io/enflame-vgpu-devices-to-allocate" not in annotations  # HAMi writes none for DRS
    ((device,),) = decode_pod_devices(annotations["hami.io/enflame-vgpu-devices-allocated"])
    index = device.uuid.rsplit("-", 1)[1]
    assert (device.type, device.usedmem, device.usedcores) == ("Enflame", 20480, 50)
    assert json.loads(annotations["assigned-containers"]) == {
        "tops": {"allocated": False, "request": 3, "profileID": "1", "profileName": "3g.20gb"}
    }
    assert (annotations["enflame.com/gcu-assigned"], annotations["enflame.com/gcu-request-size"]) == ("false", "3")
    assert annotations["enflame.com/gcu-assigned-index"] == annotations["enflame.com/gcu-assigned-id"] == index
    stack.admin.delete("Pod", "drs", ns)
