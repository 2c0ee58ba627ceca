"""Moore Threads sGPU shares and whole GPUs through the real path, on a node of two MTT S4000.

The node runs `hami node` with the Moore Threads plugin reading the Moore Threads package's own fake MTML
(vendors/mthreads/tests/fake_mtml, a `libmtml.so` answering MTML's documented calls from a machine file), exactly as
it would read the real driver library. The node's capacity is what HAMi's scheduler reads for these GPUs
(``mthreads.com/sgpu-core`` 16 per GPU, ``mthreads.com/sgpu-memory`` in 512 MiB units); this scheduler fits from the
per-GPU register and writes HAMi's ``mthreads.com/*`` pod annotations; the admission webhook writes HAMi's
whole-GPU limits.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from control_plane import ROOT, build_fake_library, wait_until
from hami_stack import DeviceNode, HamiStack
from prometheus_client.parser import text_string_to_metric_families

from hami.codec import decode_pod_devices
from hami.plugins import VendorPlugins

pytestmark = pytest.mark.e2e

FAKE_MTML = ROOT / "vendors" / "mthreads" / "tests" / "fake_mtml" / "fake_mtml.c"
UUIDS = [f"0c8e1a2b-0000-4000-8000-00000000000{i}" for i in range(2)]


def _build_fake_mtml(directory: Path) -> Path:
    return build_fake_library(FAKE_MTML, directory / "libmtml.so")


@pytest.fixture(scope="module")
def mt_node(stack: HamiStack) -> Iterator[DeviceNode]:
    if "mthreads" not in {v.name for v in VendorPlugins.load().vendors}:
        pytest.skip("the Moore Threads vendor plugin (hami-vendor-mthreads) is not installed")
    root = stack.dir / "nodes" / "mt-node-1"
    library = _build_fake_mtml(root / "fake-mtml")
    machine = root / "machine.txt"
    # uuid name sbdf total used cores numa mpc-type switch (fake_mtml.c's format)
    machine.write_text("".join(f"{u} MTT_S4000 00000000:{0x3A + i:02X}:00.0 {48 << 30} 0 8 0 0 0\n"
                               for i, u in enumerate(UUIDS)))  # fmt: skip
    node = DeviceNode(
        stack,
        "mt-node-1",
        {"mthreads": {"mtmlLibrary": str(library), "mthreadsGmi": str(root / "no-mthreads-gmi")}},
        {"FAKE_MTML_CONFIG": str(machine)},
        # HAMi's capacity form: 16 cores per GPU, 48 GiB = 96 units of 512 MiB per GPU
        {"mthreads.com/vgpu": "2", "mthreads.com/sgpu-core": "32", "mthreads.com/sgpu-memory": "192"},
        ("hami.io/node-mthreads-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)  # the node leaves the cluster: later tests see the GPU nodes only


def _run(stack: HamiStack, ns: str, name: str, limits: dict[str, str]) -> dict[str, Any]:
    api = stack.admin
    api.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "musa-pytorch", "resources": {"limits": limits}}]},
        }
    )

    def running() -> dict[str, Any] | None:
        got = api.get("Pod", name, ns)
        return got if got["status"].get("phase") == "Running" else None

    def describe() -> str:
        got = api.get("Pod", name, ns)
        events = [f"{e['reason']}: {e['message']}" for e in api.events_about(ns, name)]
        return f"pod: {got['metadata']}\nspec: {got['spec']}\nstatus: {got['status']}\nevents: {events}\n" + (
            stack.diagnose()
        )

    return wait_until(running, 60, f"the Moore Threads pod {name} Running", describe)


def test_an_sgpu_share_runs_with_hamis_annotations_and_moore_threads_env(
    stack: HamiStack, mt_node: DeviceNode, ns: str
) -> None:
    before = time.time_ns()
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "16", "mthreads.com/sgpu-core": "4"}
    got = _run(stack, ns, "sgpu", limits)
    assert got["spec"]["nodeName"] == mt_node.name
    annotations = got["metadata"]["annotations"]
    ((device,),) = decode_pod_devices(annotations["hami.io/mthreads-vgpu-devices-allocated"])
    assert device.uuid in UUIDS
    assert (device.usedmem, device.usedcores) == (8192, 4)  # 16 × 512 MiB, 4 of 16 cores
    index = UUIDS.index(device.uuid)
    assert annotations["mthreads.com/gpu-index"] == str(index)
    assert annotations["mthreads.com/predicate-node"] == mt_node.name
    assert before <= int(annotations["mthreads.com/predicate-time"]) <= time.time_ns()
    served = mt_node.kubelet.started[got["metadata"]["uid"]]
    edits = served.edits["main"]["mthreads.com/vgpu"]
    assert dict(edits.env) == {
        "MTHREADS_VISIBLE_DEVICES": str(index),
        "MTHREADS_DRIVER_CAPABILITIES": "compute,utility",
        "MUSA_VISIBLE_DEVICES": "0",
    }
    assert [d.host_path for d in edits.devices] == [f"/dev/mtgpu.{index}", f"/dev/dri/card{index + 1}",
                                                    f"/dev/dri/renderD{128 + index}"]  # fmt: skip
    # the node daemon's hami_* families carry both GPUs and the container's limit on its GPU
    with urllib.request.urlopen(f"http://127.0.0.1:{mt_node.metrics_port}/metrics", timeout=10) as response:
        families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
    plugins = {s.labels["device_uuid"] for s in families["hami_host_gpu_memory_used_bytes"].samples}
    assert plugins >= set(UUIDS)
    (limit,) = [s for s in families["hami_vgpu_memory_limit_bytes"].samples if s.labels["pod"] == "sgpu"]
    assert (limit.labels["device_uuid"], limit.value) == (device.uuid, 8192 * 2**20)
    stack.admin.delete("Pod", "sgpu", ns)


def test_two_gpus_are_whole_gpus_with_hamis_webhook_limits(stack: HamiStack, mt_node: DeviceNode, ns: str) -> None:
    def free() -> bool | None:  # the first test's pod is gone from the node, and from its capacity
        pods = stack.admin.list("Pod", None, fieldSelector=f"spec.nodeName={mt_node.name}").get("items", [])
        return True if not pods else None

    wait_until(free, 60, "the earlier pod deleted", stack.diagnose)
    got = _run(stack, ns, "two", {"mthreads.com/vgpu": "2"})
    limits = got["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["mthreads.com/sgpu-core"], limits["mthreads.com/sgpu-memory"]) == ("32", "192")
    annotations = got["metadata"]["annotations"]
    assert annotations["mthreads.com/request-gpu-num"] == "2"
    (devices,) = decode_pod_devices(annotations["hami.io/mthreads-vgpu-devices-allocated"])
    assert sorted(d.uuid for d in devices) == UUIDS
    assert all((d.usedmem, d.usedcores) == (49152, 16) for d in devices)
    assert sorted(annotations["mthreads.com/gpu-index"].split(",")) == ["0", "1"]


@pytest.fixture(scope="module")
def soft_node(stack: HamiStack) -> Iterator[DeviceNode]:
    """A second node, in this project's hami-core mode (libvmusa.so), with GPUs of its own."""
    root = stack.dir / "nodes" / "mt-node-2"
    library = _build_fake_mtml(root / "fake-mtml")
    machine = root / "machine.txt"
    machine.write_text(f"{SOFT_UUID} MTT_S4000 00000000:5A:00.0 {48 << 30} 0 8 0 0 0\n")
    settings = {
        "mtmlLibrary": str(library),
        "mthreadsGmi": str(root / "no-mthreads-gmi"),
        "sharingMode": "hami-core",
        "hookPath": str(root / "mthreads-hook"),
    }
    node = DeviceNode(
        stack,
        "mt-node-2",
        {"mthreads": settings},
        {"FAKE_MTML_CONFIG": str(machine)},
        {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-core": "16", "mthreads.com/sgpu-memory": "96"},
        ("hami.io/node-mthreads-register",),
    )
    stack.add_node(node)
    yield node
    node.stop()
    del stack.nodes[node.name]
    stack.admin.delete("Node", node.name)


SOFT_UUID = "7b3c9d10-0000-4000-8000-0000000000aa"


def test_a_soft_mode_node_serves_libvmusa_with_its_grant(stack: HamiStack, soft_node: DeviceNode, ns: str) -> None:
    limits = {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "16", "mthreads.com/sgpu-core": "4"}
    container = {"name": "main", "image": "musa-pytorch", "resources": {"limits": limits}}
    metadata = {"name": "soft", "namespace": ns, "annotations": {"mthreads.ai/use-gpuuuid": SOFT_UUID}}
    stack.admin.create({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": {"containers": [container]}})
    got = wait_until(lambda: _phase(stack, ns, "soft") == "Running" or None, 60, "the soft-mode pod Running",
                     stack.diagnose)  # fmt: skip
    pod = stack.admin.get("Pod", "soft", ns)
    assert pod["spec"]["nodeName"] == soft_node.name, got
    edits = soft_node.kubelet.started[pod["metadata"]["uid"]].edits["main"]["mthreads.com/vgpu"]
    assert (edits.env["MUSA_DEVICE_MEMORY_LIMIT_0"], edits.env["MUSA_DEVICE_SM_LIMIT_0"]) == ("8192m", "25")
    mounts = {m.container_path: m for m in edits.mounts}
    preload = mounts["/etc/ld.so.preload"]
    library = Path(preload.host_path).read_text().split()[0]  # the node daemon installed libvmusa.so and named it
    assert Path(library).name == "libvmusa.so"
    assert Path(library).resolve().is_file()
    assert mounts[library].read_only
    grant = Path(mounts["/etc/hami/grant"].host_path) / "mthreads.grant"
    assert str(8192 << 20) in grant.read_text()  # written by the node daemon before it answered the kubelet
    accounting = Path(mounts["/hami-vmusa-shmem"].host_path)
    assert accounting.is_dir()
    assert not mounts["/hami-vmusa-shmem"].read_only
    stack.admin.delete("Pod", "soft", ns)
    wait_until(lambda: not accounting.exists() or None, 60, "the accounting directory removed with the pod",
               stack.diagnose)  # fmt: skip


def _phase(stack: HamiStack, ns: str, name: str) -> str:
    return str(stack.admin.get("Pod", name, ns)["status"].get("phase", ""))
