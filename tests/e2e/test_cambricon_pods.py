"""A dynamic-sMLU share through the real path, on a node of two Cambricon MLU370-X8 cards.

The node runs `hami node` with the Cambricon plugin reading the Cambricon package's own fake CNDev
(vendors/cambricon/tests/fake_cndev, a `libcndev.so` answering CNDev's documented calls from a machine file), exactly
as it would read the real driver library. The node's capacity is what HAMi's scheduler reads for MLUs (vcore 100 per
card, vmemory in 256 MiB units); this scheduler fits from the per-card register. The test skips, saying why, while
the Cambricon plugin or its fake CNDev is not there.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_plane import ROOT, which_cc
from hami_stack import DeviceNode, HamiStack

from hami.codec import decode_pod_devices
from hami.plugins import VendorHost

pytestmark = pytest.mark.e2e

FAKE_CNDEV = ROOT / "vendors" / "cambricon" / "tests" / "fake_cndev" / "fake_cndev.c"
UUIDS = [f"a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(2)]


def _require_cambricon() -> None:
    vendors = {v.name: v for v in VendorHost.load().vendors}
    if "cambricon" not in vendors:
        pytest.skip("the Cambricon vendor plugin (hami-vendor-cambricon) is not installed")
    if not FAKE_CNDEV.exists():
        pytest.skip(f"the Cambricon fake CNDev ({FAKE_CNDEV.relative_to(ROOT)}) is not there")


def _build_fake_cndev(directory: Path) -> Path:
    cc = which_cc()
    if cc is None:
        pytest.skip("no C compiler to build the Cambricon fake CNDev")
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "libcndev.so"
    argv = [cc, "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-o", str(out), str(FAKE_CNDEV)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture(scope="module")
def mlu_node(stack: HamiStack) -> Iterator[DeviceNode]:
    _require_cambricon()
    root = stack.dir / "nodes" / "mlu-node-1"
    library = _build_fake_cndev(root / "fake-cndev")
    machine = root / "machine.txt"
    machine.write_text("".join(f"{u} MLU370-X8 24576 8 1\n" for u in UUIDS))  # fake_cndev.c's format
    node = DeviceNode(
        stack,
        "mlu-node-1",
        {"cambricon": {"cndevLibrary": str(library)}},
        {"FAKE_CNDEV_CONFIG": str(machine)},
        # HAMi's capacity form: 100 vcore per card, 24576 MiB = 96 units of 256 MiB per card
        {"cambricon.com/vmlu": "2", "cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "192"},
        ("hami.io/node-cambricon-mlu-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)  # the node leaves the cluster: later tests see the GPU nodes only


def test_a_dsmlu_share_runs_with_its_profile_and_cambricons_env(
    stack: HamiStack, mlu_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    limits = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "25", "cambricon.com/mlu.smlu.vmemory": "16"}
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mlu", "namespace": ns},
            "spec": {"containers": [{"name": "infer", "image": "pytorch-mlu", "resources": {"limits": limits}}]},
        }
    )

    got = stack.wait_running(ns, "mlu")
    assert got["spec"]["schedulerName"] == "hami-scheduler"
    assert got["spec"]["nodeName"] == mlu_node.name
    annotations = got["metadata"]["annotations"]
    assert annotations["hami.io/bind-phase"] == "success"
    ((device,),) = decode_pod_devices(annotations["hami.io/cambricon-mlu-devices-allocated"])
    index = [f"MLU-{u}" for u in UUIDS].index(device.uuid)
    assert (device.usedmem, device.usedcores) == (4096, 25)
    assert annotations["CAMBRICON_DSMLU_PROFILE"] == f"{index}_25_16"
    assert annotations["CAMBRICON_DSMLU_ASSIGNED"] == annotations["CAMBRICON_DSMLU_ASSIGHED"] == "true"
    served = mlu_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["infer"]["cambricon.com/vmlu"]
    assert edits.env["CAMBRICON_VISIBLE_DEVICES"] == str(index)
    node = api.get("Node", mlu_node.name)
    assert "cambricon.com/dsmlu.lock" not in (node["metadata"].get("annotations") or {})
