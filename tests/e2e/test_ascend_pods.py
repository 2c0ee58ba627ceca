"""An Ascend pod with a template request through the real path, on a node of two Ascend 910B3 NPUs.

The node runs `hami node` with the Ascend plugin reading the Ascend package's own fake DCMI
(vendors/ascend/tests/fake_dcmi, a `libdcmi.so` answering DCMI's documented calls from a machine file), exactly as
it would read the real driver library: nothing about the NPUs is written for the daemon. The test skips, saying
why, while the Ascend plugin lacks discovery, fitting or container edits, or its fake DCMI is not there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

CHIP = "Ascend910B3"
FAKE_DCMI = ROOT / "vendors" / "ascend" / "tests" / "fake_dcmi" / "fake_dcmi.c"
REQUIRED_HOOKS = ("hami_discover_devices", "hami_fit_nodes", "hami_container_edits")
NPUS = [(i, 0x3B0A0000 + i) for i in range(2)]
"""(physical id, first die word) of the node's NPUs."""


def _require_ascend() -> None:
    vendors = {v.name: v for v in VendorPlugins.load().vendors}
    if "ascend" not in vendors:
        pytest.skip("the Ascend vendor plugin (hami-vendor-ascend) is not installed")
    missing = [h for h in REQUIRED_HOOKS if h not in vendors["ascend"].hooks]
    if missing:
        pytest.skip(f"the Ascend plugin does not implement {', '.join(missing)} yet (vendors/ascend is in progress)")
    if not FAKE_DCMI.exists():
        pytest.skip(f"the Ascend fake DCMI ({FAKE_DCMI.relative_to(ROOT)}) is not there yet")


def _build_fake_dcmi(directory: Path) -> Path:
    return build_fake_library(FAKE_DCMI, directory / "libdcmi.so")


def _uuid(die0: int) -> str:
    return "-".join(f"{w:08X}" for w in (die0, 0x11, 0x22, 0x33, 0x44))


@pytest.fixture(scope="module")
def npu_node(stack: HamiStack) -> Iterator[DeviceNode]:
    _require_ascend()
    root = stack.dir / "nodes" / "npu-node-1"
    library = _build_fake_dcmi(root / "fake-dcmi")
    machine = root / "machine.txt"
    # card device logic phy chip_name aicore health memory_mb die0..die4 hbm (fake_dcmi.c's format)
    machine.write_text("".join(f"{p} 0 {p} {p} 910B3 20 0 65536 {d:x} 11 22 33 44 hbm\n" for p, d in NPUS))
    settings = {
        "dcmiLibrary": str(library),
        "npuSmi": str(root / "no-npu-smi"),
        "hookPath": str(root / "usr"),
    }
    node = DeviceNode(
        stack,
        "npu-node-1",
        {"ascend": settings},
        {"FAKE_DCMI_CONFIG": str(machine)},
        {f"huawei.com/{CHIP}": None},  # how many IDs a chip advertises is the plugin's choice
        (f"hami.io/node-register-{CHIP}",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)  # the node leaves the cluster: later tests see the GPU nodes only


def test_an_ascend_template_request_gets_the_smallest_template_that_holds_it(
    stack: HamiStack, npu_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    limits = {f"huawei.com/{CHIP}": "1", f"huawei.com/{CHIP}-memory": "8000"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "npu", "namespace": ns},
            "spec": {"containers": [{"name": "ascend", "image": "ascend-pytorch", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", "npu", ns)
        return got if got["status"].get("phase") == "Running" else None

    def describe() -> str:
        got = api.get("Pod", "npu", ns)
        events = [f"{e['reason']}: {e['message']}" for e in api.events_about(ns, "npu")]
        return f"pod: {got['metadata']}\nstatus: {got['status']}\nevents: {events}\n{stack.diagnose()}"

    got = wait_until(running, 60, "the Ascend pod Running", describe)
    assert got["spec"]["schedulerName"] == "hami-scheduler"
    assert got["spec"]["nodeName"] == npu_node.name
    annotations = got["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "success"
    ((device,),) = decode_pod_devices(annotations[f"hami.io/{CHIP}-devices-allocated"])
    assert device.uuid in {_uuid(d) for _, d in NPUS}
    assert device.usedmem == 16384, "8000 MiB is served by vir05_1c_16g, the smallest 910B3 template that holds it"
    served = npu_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["ascend"][f"huawei.com/{CHIP}"]
    physical = {_uuid(d): p for p, d in NPUS}[device.uuid]
    assert edits.env["ASCEND_VISIBLE_DEVICES"] == str(physical)
    assert edits.env["ASCEND_VNPU_SPECS"] == "vir05_1c_16g"
