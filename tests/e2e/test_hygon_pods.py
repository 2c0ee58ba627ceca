"""A Hygon DCU share through the real path, on a node of two Z100L DCUs in HAMi's vDCU mode.

The node runs `hami node` with the Hygon plugin reading the Hygon package's own fake ROCm SMI and DMI libraries
(vendors/hygon/tests/fake_dtk, `librocm_smi64.so` and `libhydmi.so` answering their documented calls from a machine
file), exactly as it would read DTK's: nothing about the DCUs is written for the daemon. The pod's share becomes a
virtual DCU created through the fake DMI, described by HAMi's vdev file mounted into the container, and destroyed
when the pod is deleted.
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

FAKE_DTK = ROOT / "vendors" / "hygon" / "tests" / "fake_dtk" / "fake_dtk.c"
SERIALS = ["PD23010000", "PD23010001"]


def _build(directory: Path) -> dict[str, str]:
    return {
        variant: str(build_fake_library(FAKE_DTK, directory / name, f"-DFAKE_{variant}"))
        for variant, name in (("RSMI", "librocm_smi64.so"), ("DMI", "libhydmi.so"))
    }


@pytest.fixture(scope="module")
def dcu_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "hygon" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the Hygon vendor plugin (hami-vendor-hygon) is not installed")
    root = stack.dir / "nodes" / "dcu-node-1"
    libraries = _build(root / "fake-dtk")
    machine = root / "machine.txt"
    # domain bus device function serial device-id vram-total vram-used cus numa (fake_dtk.c's format)
    machine.write_text("".join(f"0 {16 + i} 0 0 {s} 55b7 {64 << 30} 0 60 0\n" for i, s in enumerate(SERIALS)))
    for i in range(len(SERIALS)):
        drm = root / "sys" / "bus" / "pci" / "devices" / f"0000:{16 + i:02x}:00.0" / "drm"
        (drm / f"card{i + 1}").mkdir(parents=True, exist_ok=True)
        (drm / f"renderD{128 + i}").mkdir(exist_ok=True)
    settings = {
        "rocmSmiLibrary": libraries["RSMI"],
        "dmiLibrary": libraries["DMI"],
        "hySmi": str(root / "no-hy-smi"),
        "sysfsRoot": str(root / "sys"),
        "vdevDir": str(root / "vgpu" / "dcu"),
        "exporterDir": str(root / "etc-vdev"),
    }
    node = DeviceNode(
        stack,
        "dcu-node-1",
        {"hygon": settings},
        {"FAKE_DTK_CONFIG": str(machine), "FAKE_DTK_STATE": str(root / "vdevs.state")},
        {"hygon.com/dcunum": None},
        ("hami.io/node-dcu-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


def test_a_dcu_share_gets_a_vdcu_that_is_destroyed_with_the_pod(
    stack: HamiStack, dcu_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    limits = {"hygon.com/dcunum": "1", "hygon.com/dcumem": "16384", "hygon.com/dcucores": "50"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "dcu", "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "dtk-pytorch", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", "dcu", ns)
        return got if got["status"].get("phase") == "Running" else None

    def describe() -> str:
        got = api.get("Pod", "dcu", ns)
        events = [f"{e['reason']}: {e['message']}" for e in api.events_about(ns, "dcu")]
        return f"pod: {got['metadata']}\nstatus: {got['status']}\nevents: {events}\n{stack.diagnose()}"

    got = wait_until(running, 60, "the DCU pod Running", describe)
    assert got["spec"]["nodeName"] == dcu_node.name
    annotations = got["metadata"]["annotations"]
    ((device,),) = decode_pod_devices(annotations["hami.io/dcu-devices-allocated"])
    assert device.uuid in {f"DCU-{s}" for s in SERIALS}
    assert (device.usedmem, device.usedcores) == (16384, 50)
    served = dcu_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["main"]["hygon.com/dcunum"]
    index = [f"DCU-{s}" for s in SERIALS].index(device.uuid)
    assert [d.host_path for d in edits.devices] == ["/dev/kfd", "/dev/mkfd", f"/dev/dri/card{index + 1}",
                                                    f"/dev/dri/renderD{128 + index}"]  # fmt: skip
    vdev = next(m for m in edits.mounts if m.container_path == "/etc/vdev/docker/")
    conf = (Path(vdev.host_path) / "vdev0.conf").read_text()
    assert f"PciBusId: 0000:{16 + index:02x}:00.0\n" in conf
    assert "cu_count: 30\nmem: 16384 MiB\n" in conf
    state = dcu_node.dir / "vdevs.state"
    assert state.read_text().split() == ["0", str(index), "30", "16384"]

    api.delete("Pod", "dcu", ns)
    wait_until(lambda: (not state.read_text().strip() and not Path(vdev.host_path).exists()) or None, 60,
               "the vDCU destroyed after the pod was deleted", describe)  # fmt: skip
