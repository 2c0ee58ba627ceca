"""A dynamic-sMLU share through the real path, on a node of two Cambricon MLU370-X8 cards joined by MLU-Link.

The node runs `hami node` with the Cambricon plugin reading the Cambricon package's own fake CNDev
(vendors/cambricon/tests/fake_cndev, a `libcndev.so` answering CNDev's documented calls from a machine file, its
sMLU profiles and instances kept in a state file as a driver keeps them), exactly as it would read the real driver
library. The node's capacity is what HAMi's scheduler reads for MLUs (vcore 100 per card, vmemory in 256 MiB
units); this scheduler fits from the per-card register. The driver starts with an instance a crashed daemon left
for a pod that no longer exists: `hami node` destroys it at start. The pod's share gets its own sMLU instance of
exactly its size, which goes when the pod is deleted; the node daemon's metrics carry the cards and the container's
limit. A second node runs in the soft mode (``mluMode: hami-core``): its share gets the card whole with
``libvmlu.so`` (installed by ``hami node``), the limits and the node's grant.
The test skips, saying why, while the Cambricon plugin or its fake CNDev is not there.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack
from prometheus_client.parser import text_string_to_metric_families

from hami.codec import decode_link_scores, decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_CNDEV = ROOT / "vendors" / "cambricon" / "tests" / "fake_cndev" / "fake_cndev.c"
UUIDS = [f"a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(2)]
GONE_POD = "0a1b2c3d-0000-4000-8000-0000000dead0"
MIB = 1024 * 1024


def driver_state(node: DeviceNode) -> list[list[str]]:
    """The fake driver's sMLU profiles (``P card id quota bytes``) and instances (``I card id profile name``)."""
    path = node.dir / "cndev-state.txt"  # the nodes' directories are stack.dir / "nodes" / <name>
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def _require_cambricon() -> None:
    vendors = {v.name: v for v in VendorPlugins.load().vendors}
    if "cambricon" not in vendors:
        pytest.skip("the Cambricon vendor plugin (hami-vendor-cambricon) is not installed")
    if not FAKE_CNDEV.exists():
        pytest.skip(f"the Cambricon fake CNDev ({FAKE_CNDEV.relative_to(ROOT)}) is not there")


def _build_fake_cndev(directory: Path) -> Path:
    return build_fake_library(FAKE_CNDEV, directory / "libcndev.so")


@pytest.fixture(scope="module")
def mlu_node(stack: HamiStack) -> Iterator[DeviceNode]:
    _require_cambricon()
    root = stack.dir / "nodes" / "mlu-node-1"
    library = _build_fake_cndev(root / "fake-cndev")
    machine = root / "machine.txt"
    # fake_cndev.c's format: uuid, name, MB, cores, health, sMLU mode, MLU-Link peers (two ports between the cards)
    machine.write_text(
        "".join(f"{u} MLU370-X8 24576 8 1 1 {UUIDS[1 - i]},{UUIDS[1 - i]}\n" for i, u in enumerate(UUIDS))
    )
    # left by a daemon that crashed: an sMLU for a pod deleted since
    (root / "cndev-state.txt").write_text(f"P 1 1 50 {8192 * MIB}\nI 1 1 1 hami-{GONE_POD}-0\n")
    node = DeviceNode(
        stack,
        "mlu-node-1",
        {"cambricon": {"cndevLibrary": str(library)}},
        {"FAKE_CNDEV_CONFIG": str(machine), "FAKE_CNDEV_STATE": str(root / "cndev-state.txt")},
        # HAMi's capacity form: 100 vcore per card, 24576 MiB = 96 units of 256 MiB per card
        {"cambricon.com/vmlu": "2", "cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "192"},
        ("hami.io/node-cambricon-mlu-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)  # the node leaves the cluster: later tests see the GPU nodes only


SOFT_UUIDS = [f"b1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(2)]


@pytest.fixture(scope="module")
def soft_node(stack: HamiStack) -> Iterator[DeviceNode]:
    _require_cambricon()
    root = stack.dir / "nodes" / "mlu-soft-1"
    library = _build_fake_cndev(root / "fake-cndev")
    machine = root / "machine.txt"
    machine.write_text("".join(f"{u} MLU370-X8 24576 8 1 1\n" for u in SOFT_UUIDS))
    node = DeviceNode(
        stack,
        "mlu-soft-1",
        {"cambricon": {"cndevLibrary": str(library), "mluMode": "hami-core", "hookPath": str(root / "mlu-hook")}},
        {"FAKE_CNDEV_CONFIG": str(machine), "FAKE_CNDEV_STATE": str(root / "cndev-state.txt")},
        {"cambricon.com/vmlu": "2", "cambricon.com/mlu.smlu.vcore": "200", "cambricon.com/mlu.smlu.vmemory": "192"},
        ("hami.io/node-cambricon-mlu-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


def test_on_a_soft_mode_node_the_share_gets_libvmlu_its_limits_and_the_grant(
    stack: HamiStack, soft_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    limits = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "30", "cambricon.com/mlu.smlu.vmemory": "8"}
    wanted = f"MLU-{SOFT_UUIDS[1]}"  # a card of the soft node only
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "soft", "namespace": ns, "annotations": {"cambricon.com/use-gpuuuid": wanted}},
            "spec": {"containers": [{"name": "infer", "image": "pytorch-mlu", "resources": {"limits": limits}}]},
        }
    )
    got = stack.wait_running(ns, "soft")
    assert got["spec"]["nodeName"] == soft_node.name
    uid = got["metadata"]["uid"]
    edits = soft_node.kubelet.started[uid].edits["infer"]["cambricon.com/vmlu"]
    assert edits.env["CAMBRICON_VISIBLE_DEVICES"] == "1"  # the card whole: no sMLU in this mode
    assert "VIRTUAL_DEVICES" not in edits.env
    assert (edits.env["CAMBRICON_DEVICE_MEMORY_LIMIT_0"], edits.env["CAMBRICON_DEVICE_CORE_LIMIT_0"]) == ("2048m", "30")
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    library = Path(mounts["/etc/ld.so.preload"]).read_text().strip()
    assert Path(library).name == "libvmlu.so"
    assert Path(library).resolve().is_file()  # installed by hami node
    grant = Path(mounts["/etc/hami/grant"]) / "cambricon.grant"
    assert f"device 0 {2048 << 20} 30 {wanted}\n" in grant.read_text()
    assert Path(mounts["/hami-vmlu-shmem"]).is_dir()
    assert driver_state(soft_node) == []  # nothing made in the driver
    api.delete("Pod", "soft", ns)


def test_a_dsmlu_share_runs_with_its_profile_and_cambricons_env(
    stack: HamiStack, mlu_node: DeviceNode, ns: str
) -> None:
    api = stack.admin
    limits = {"cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vcore": "25", "cambricon.com/mlu.smlu.vmemory": "16"}
    ours = ",".join(f"MLU-{u}" for u in UUIDS)
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            # this node's cards (the soft-mode node of the other test may still be up)
            "metadata": {"name": "mlu", "namespace": ns, "annotations": {"cambricon.com/use-gpuuuid": ours}},
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
    uid = got["metadata"]["uid"]
    served = mlu_node.kubelet.started[uid]
    edits = served.edits["infer"]["cambricon.com/vmlu"]
    # the share's own sMLU instance: the first on its card, the crashed daemon's leftover having been destroyed
    cap = f"/dev/cambricon-caps/cap_dev{index}_mi1"
    assert edits.env["VIRTUAL_DEVICES"] == f"/dev/cambricon_dev{index},/dev/cambricon_ipcm{index},{cap}"
    assert cap in {d.host_path for d in edits.devices}
    profile, handle, card, instance = annotations["CAMBRICON_DSMLU_PROFILE_INSTANCE"].split("_")
    assert (int(handle), int(card), int(instance)) == (1 << 8 | index, index, 1)
    state = driver_state(mlu_node)
    assert ["I", str(index), "1", profile, f"hami-{uid}-0"] in state
    assert ["P", str(index), profile, "25", str(4096 * MIB)] in state
    assert not any(f"hami-{GONE_POD}-0" in line for line in state)
    node = api.get("Node", mlu_node.name)
    node_annotations = node["metadata"].get("annotations") or {}
    assert "cambricon.com/dsmlu.lock" not in node_annotations  # taken at bind, released at Allocate
    links = decode_link_scores(node_annotations["hami.io/node-cambricon-mlu-score"])
    assert links == {f"MLU-{UUIDS[0]}": {f"MLU-{UUIDS[1]}": 2}, f"MLU-{UUIDS[1]}": {f"MLU-{UUIDS[0]}": 2}}
    # the node daemon's hami_* families carry both cards and the container's limit on its card
    with urllib.request.urlopen(f"http://127.0.0.1:{mlu_node.metrics_port}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    plugins = {s.labels["device_uuid"] for s in families["hami_host_gpu_memory_used_bytes"].samples}
    assert plugins >= {f"MLU-{u}" for u in UUIDS}
    (limit,) = [s for s in families["hami_vgpu_memory_limit_bytes"].samples if s.labels["pod"] == "mlu"]
    assert (limit.labels["device_uuid"], limit.value) == (device.uuid, 4096 * MIB)

    api.delete("Pod", "mlu", ns)
    wait_until(lambda: driver_state(mlu_node) == [] or None, 60, "the sMLU destroyed after the pod was deleted",
               lambda: f"driver state: {driver_state(mlu_node)}\n{stack.diagnose()}")  # fmt: skip
