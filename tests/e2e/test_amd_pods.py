"""AMD GPU shares through the real path, on a node of two Instinct MI300X under HAMi's CU-mask split.

The node runs `hami node` with the AMD plugin reading the AMD package's own fake AMD SMI (vendors/amd/tests/fake_amdsmi,
a `libamd_smi.so` answering amdsmi.h's calls from a machine file beside it) and a sysfs tree as the amdgpu driver
shows it (each GPU's DRM nodes, the KFD topology ROCr's UUIDs come from), exactly as it would read ROCm's: nothing
about the GPUs is written for the daemon. The node registers them under HAMi's `hami.io/node-amd-register`; two pods
asking a quarter of a GPU each are placed by the scheduler (binpack: on one GPU) and served by Allocate with HAMi's
AMD edits and disjoint compute units, recorded in `hami.io/amd-cu-allocated`; a pod deleted frees its units for the
next.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_node_register, decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_AMDSMI = ROOT / "vendors" / "amd" / "tests" / "fake_amdsmi" / "fake_amdsmi.c"
UUIDS = ["0aff74a1-0000-1000-80e5-3fa5b5d4a2c0", "0aff74a1-0000-1000-80e5-3fa5b5d4a2c1"]
UNIQUE = [0x49A1C06B3B2D8F00, 0x49A1C06B3B2D8F01]
QUARTER = {"amd.com/gpu": "1", "amd.com/gpumem": "16384", "amd.com/gpucores": "25"}


@pytest.fixture(scope="module")
def amd_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "amd" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the AMD vendor plugin (hami-vendor-amd) is not installed")
    if "amd" in stack.disabled_vendors().split(","):
        pytest.skip("the chart rendered for this stack disables AMD (vendors.amd.enabled)")
    root = stack.dir / "nodes" / "amd-node-1"
    library = build_fake_library(FAKE_AMDSMI, root / "rocm" / "libamd_smi.so", "-ldl")
    # socket uuid domain bus device function CUs VRAM-bytes numa name (fake_amdsmi.c's format)
    (library.parent / "fake_amdsmi.machine").write_text(
        "".join(
            f"{i} {u} 0 {0x0C + 0x10 * i:x} 0 0 304 {192 << 30} {i} AMD Instinct MI300X\n" for i, u in enumerate(UUIDS)
        )
    )
    sys = root / "sys"
    for i in range(len(UUIDS)):
        drm = sys / "bus" / "pci" / "devices" / f"0000:{0x0C + 0x10 * i:02x}:00.0" / "drm"
        (drm / f"card{i + 1}").mkdir(parents=True, exist_ok=True)
        (drm / f"renderD{128 + i}").mkdir(exist_ok=True)
        kfd = sys / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(i + 1)
        kfd.mkdir(parents=True, exist_ok=True)
        (kfd / "properties").write_text(f"drm_render_minor {128 + i}\nunique_id {UNIQUE[i]}\n")
    settings = {"amdSmiLibrary": str(library), "sysfsRoot": str(sys), "hookPath": str(root / "vgpu-amd")}
    node = DeviceNode(stack, "amd-node-1", {"amd": settings}, {}, {"amd.com/gpu": None},
                      ("hami.io/node-amd-register",))  # fmt: skip
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)
    shutil.rmtree(root, ignore_errors=True)


def _pod(api: Any, ns: str, name: str) -> None:
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": {"hami.io/gpu-scheduler-policy": "binpack"}},
            "spec": {"containers": [{"name": "main", "image": "rocm", "resources": {"limits": dict(QUARTER)}}]},
        }
    )


def _running(stack: HamiStack, ns: str, name: str) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        got = stack.admin.get("Pod", name, ns)
        return got if got["status"].get("phase") == "Running" else None

    got: dict[str, Any] = wait_until(running, 60, f"the AMD pod {name} Running", lambda: stack.describe_pod(ns, name))
    return got


def test_two_quarter_shares_get_disjoint_compute_units_and_a_deleted_pods_are_freed(
    stack: HamiStack, amd_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    registered = api.get("Node", amd_node.name)["metadata"]["annotations"]["hami.io/node-amd-register"]
    assert [(d.id, d.index, d.devmem, d.devcore, d.type) for d in decode_node_register(registered)] == [
        (u, i + 1, 196608, 304, "AMD Instinct MI300X") for i, u in enumerate(UUIDS)
    ]
    masks = {}
    uids = {}
    for name in ("first", "second"):
        _pod(api, ns, name)
        got = _running(stack, ns, name)
        assert got["spec"]["nodeName"] == amd_node.name
        annotations = got["metadata"]["annotations"]
        ((device,),) = decode_pod_devices(annotations["hami.io/amd-devices-allocated"])
        assert (device.type, device.usedmem, device.usedcores) == ("AMD Instinct MI300X", 16384, 76)
        edits = amd_node.kubelet.started[got["metadata"]["uid"]].edits["main"]["amd.com/gpu"]
        index = UUIDS.index(device.uuid)
        assert [d.host_path for d in edits.devices] == ["/dev/kfd", f"/dev/dri/card{index + 1}",
                                                        f"/dev/dri/renderD{128 + index}"]  # fmt: skip
        assert edits.env["ROCR_VISIBLE_DEVICES"] == f"GPU-{UNIQUE[index]:016x}"
        assert edits.env["HIP_DEVICE_MEMORY_LIMIT"] == "16384m"
        units = edits.env["HSA_CU_MASK"].removeprefix("0:")
        assert json.loads(annotations["hami.io/amd-cu-allocated"]) == {device.uuid: units}
        masks[name] = (device.uuid, units)
        uids[name] = got["metadata"]["uid"]
    # binpack put both on one GPU; their compute units do not overlap
    assert masks["first"][0] == masks["second"][0]
    assert {masks["first"][1], masks["second"][1]} == {"0-75", "76-151"}

    freed = masks["first"][1]
    api.delete("Pod", "first", ns)
    record = amd_node.dir / "vgpu-amd" / "cu" / "containers" / f"{uids['first']}_main"
    assert record.is_dir()
    wait_until(lambda: (not record.exists()) or None, 60, "the first pod's compute units released",
               lambda: stack.describe_pod(ns, "first"))  # fmt: skip
    _pod(api, ns, "third")
    got = _running(stack, ns, "third")
    edits = amd_node.kubelet.started[got["metadata"]["uid"]].edits["main"]["amd.com/gpu"]
    ((device,),) = decode_pod_devices(got["metadata"]["annotations"]["hami.io/amd-devices-allocated"])
    if device.uuid == masks["second"][0]:  # the same GPU: the units the deleted pod held are given again
        assert edits.env["HSA_CU_MASK"] == f"0:{freed}"
