"""`hami demo --json`, run as a user runs it: every example pod's outcome, checked one by one.

The demo is started once for the module as its own process (`python -m hami.cli demo --json`) from the
repository root, with its work directory under the test's temporary folder so its components' logs are
there to read when something fails. Every pod of `examples/pods/` must have an expectation here: a new
example without one fails `test_every_example_pod_has_an_expectation`.

Every vendor's pods run: what a vendor's Allocate would ask its driver (an NPU's physical id, a DCU's PCI address
and DRM nodes, an Iluvatar chip's minor number) comes from the inventory's `driver` facts, so each pod is checked
for the env and device nodes its vendor gives on hardware.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hami.demo.examples import load_examples
from hami.node.simulated import load_inventory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
INVENTORY = load_inventory(EXAMPLES / "demo-inventory.yaml")
NUMA = {d.id: d.numa for node in INVENTORY.nodes for entry in node.devices for d in entry.devices()}


@dataclass
class Demo:
    status: int
    report: dict[str, Any]
    stdout: str
    workdir: Path

    def pod(self, key: str) -> dict[str, Any]:
        for pod in self.report["pods"]:
            if f"{pod['namespace']}/{pod['name']}" == key:
                return dict(pod)
        raise AssertionError(f"the demo reports no pod {key}; it reports {[p['name'] for p in self.report['pods']]}")

    def logs(self) -> str:
        out = []
        for log in sorted((self.workdir / "logs").glob("*.log")):
            out.append(f"--- {log.name}\n" + log.read_text(errors="replace")[-3000:])
        return "\n".join(out)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    workdir = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", "demo", "--json", "--workdir", str(workdir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"the demo printed nothing (status {done.returncode}):\n{done.stderr}"
    report = json.loads(lines[-1])
    return Demo(done.returncode, report, done.stdout, workdir)


def _devices(pod: dict[str, Any], kind: str = "NVIDIA") -> list[dict[str, Any]]:
    return [d for d in pod["devices"] if d["kind"] == kind]


def _running(pod: dict[str, Any], node: str | None = None) -> None:
    assert pod["outcome"] == "running", pod
    assert (pod["step"], pod["reason"]) == ("", "")
    if node is not None:
        assert pod["node"] == node


# --------------------------------------------------------------------------------------------------------
# The expectations, one per example pod
# --------------------------------------------------------------------------------------------------------


def nvidia_memory(pod: dict[str, Any]) -> None:
    _running(pod)
    (device,) = _devices(pod)
    assert (device["memory"], device["cores"]) == (3000, 0)
    env = pod["env"]["cuda"]
    assert env["NVIDIA_VISIBLE_DEVICES"] == device["uuid"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert "/etc/ld.so.preload <- " in " ".join(pod["mounts"]["cuda"])


def nvidia_percentage(pod: dict[str, Any]) -> None:
    _running(pod)
    (device,) = _devices(pod)
    total = next(d.devmem for n in INVENTORY.nodes for e in n.devices for d in e.devices() if d.id == device["uuid"])
    assert device["memory"] == total // 2
    assert pod["env"]["cuda"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{total // 2}m"


def nvidia_cores(pod: dict[str, Any]) -> None:
    _running(pod)
    (device,) = _devices(pod)
    assert (device["memory"], device["cores"]) == (4000, 30)
    assert pod["env"]["cuda"]["CUDA_DEVICE_SM_LIMIT"] == "30"


def nvidia_multi_gpu(pod: dict[str, Any]) -> None:
    _running(pod)
    devices = _devices(pod)
    assert len({d["uuid"] for d in devices}) == 2
    assert all(d["memory"] == 10000 for d in devices)
    env = pod["env"]["trainer"]
    assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("10000m", "10000m")


def nvidia_selectors(pod: dict[str, Any]) -> None:
    _running(pod, "mixed-node")
    (device,) = _devices(pod)
    assert "T4" in device["type"]


def nvidia_numa(pod: dict[str, Any]) -> None:
    _running(pod, "gpu-node")
    devices = _devices(pod)
    assert len(devices) == 4
    assert len({NUMA[d["uuid"]] for d in devices}) == 1, devices


def nvidia_topology(pod: dict[str, Any]) -> None:
    _running(pod, "gpu-node")
    islands = {frozenset(f"GPU-a100-{i}" for i in range(4)), frozenset(f"GPU-a100-{i}" for i in range(4, 8))}
    assert frozenset(d["uuid"] for d in _devices(pod)) in islands


def nvidia_mig(pod: dict[str, Any]) -> None:
    _running(pod, "mixed-node")
    (device,) = _devices(pod)
    assert device["uuid"] == "GPU-a100mig-0"
    assert device["memory"] == 9728  # the 1g.10gb profile's memory, the smallest that holds 8000 MiB
    reservation = json.loads(pod["annotations"]["hami.io/vgpu-mig-allocations"])
    assert [(r["gpuUUID"], r["profile"]) for r in reservation] == [("GPU-a100mig-0", "1g.10gb")]


def quota_first(pod: dict[str, Any]) -> None:
    _running(pod)
    assert _devices(pod)[0]["memory"] == 6000


def quota_second(pod: dict[str, Any]) -> None:
    assert (pod["outcome"], pod["step"]) == ("refused", "admission"), pod
    assert "ResourceQuota team-a/gpu-memory" in pod["reason"]
    assert "12000 MiB in all" in pod["reason"]


def _driver(uuid: str) -> dict[str, Any]:
    """The inventory's `driver` facts of device `uuid` (what its vendor's driver would tell Allocate)."""
    for node in INVENTORY.nodes:
        for entry in node.devices:
            facts = entry.driver_facts()
            if uuid in facts:
                return facts[uuid]
    raise AssertionError(f"the demo inventory has no device {uuid}")


def _physical_ids(devices: list[dict[str, Any]]) -> str:
    return ",".join(str(_driver(d["uuid"])["phyId"]) for d in devices)


def ascend_template(pod: dict[str, Any]) -> None:
    _running(pod, "ascend-node")  # template shares go to the node that does not serve soft split
    (device,) = devices = _devices(pod, "Ascend910B3")
    assert device["memory"] == 16384  # 12000 MiB rounded up to the vir05_1c_16g template
    assert pod["env"]["npu"] == {"ASCEND_VISIBLE_DEVICES": _physical_ids(devices), "ASCEND_VNPU_SPECS": "vir05_1c_16g"}


def ascend_soft_split(pod: dict[str, Any]) -> None:
    _running(pod, "mixed-node")  # the node whose daemon serves soft split (hami-vnpu-core: "true")
    (device,) = devices = _devices(pod, "Ascend910B3")
    assert (device["memory"], device["cores"]) == (8192, 25)
    env = pod["env"]["npu"]
    assert env["ASCEND_VISIBLE_DEVICES"] == _physical_ids(devices)
    assert (env["ASCEND_DEVICE_MEMORY_LIMIT_0"], env["ASCEND_DEVICE_CORE_LIMIT_0"]) == ("8192m", "25")
    assert env["ASCEND_DEVICE_UUIDS"] == device["uuid"]


def ascend_whole_cards(pod: dict[str, Any]) -> None:
    _running(pod)
    assert pod["node"] in ("ascend-node", "mixed-node"), pod
    devices = _devices(pod, "Ascend910B3")
    assert len({d["uuid"] for d in devices}) == 2
    assert all(d["memory"] == 65536 for d in devices)
    assert pod["env"]["trainer"] == {"ASCEND_VISIBLE_DEVICES": _physical_ids(devices)}  # whole cards: nothing else


def hygon_vdcu(pod: dict[str, Any]) -> None:
    _running(pod, "dcu-node")
    (device,) = _devices(pod, "DCU")
    assert (device["memory"], device["cores"]) == (16384, 50)
    facts = _driver(device["uuid"])
    card, render = f"/dev/dri/{facts['drmCard']}", f"/dev/dri/{facts['drmRender']}"
    assert pod["device_nodes"]["dcu"] == ["/dev/kfd", "/dev/mkfd", card, render]
    assert "dcu" not in pod["env"]  # HAMi sets no environment for DCUs
    vdev, *driver_dirs = pod["mounts"]["dcu"]
    assert vdev.startswith("/etc/vdev/docker/ <- ")
    assert driver_dirs == ["/opt/hygondriver", "/opt/hyhal"]
    (conf,) = Path(vdev.split(" <- ", 1)[1]).glob("vdev*.conf")  # the vDCU's file, in the demo's work directory
    assert f"PciBusId: {facts['bdf']}" in conf.read_text().splitlines()


def iluvatar_share(pod: dict[str, Any]) -> None:
    _running(pod, "iluvatar-node")
    (device,) = _devices(pod, "BI-V150")
    assert (device["memory"], device["cores"]) == (4096, 50)  # 16 x 256 MiB
    env = pod["env"]["corex"]
    assert (env["IX_VISIBLE_DEVICES"], env["ILUVATAR_COREX_VISIBLE_DEVICES"]) == (device["uuid"], device["uuid"])
    assert pod["device_nodes"]["corex"] == [f"/dev/iluvatar{_driver(device['uuid'])['minor']}", "/dev/itrctl"]


def mthreads_sgpu(pod: dict[str, Any]) -> None:
    _running(pod, "mt-node")
    (device,) = _devices(pod, "Mthreads")
    assert (device["memory"], device["cores"], device["cores_total"]) == (8192, 4, 16)  # 16 × 512 MiB, 4 of 16 cores
    index = device["uuid"].rsplit("-", 1)[1]
    env = pod["env"]["musa"]
    assert (env["MTHREADS_VISIBLE_DEVICES"], env["MUSA_VISIBLE_DEVICES"]) == (index, "0")
    assert env["MTHREADS_DRIVER_CAPABILITIES"] == "compute,utility"


def metax_sgpu(pod: dict[str, Any]) -> None:
    _running(pod, "metax-node")
    (device,) = _devices(pod, "Metax-SGPU")
    assert (device["memory"], device["cores"]) == (8192, 30)  # vmemory 8 is 8 GiB
    env = pod["env"]["maca"]
    assert env["METAX_VISIBLE_DEVICES"] == device["uuid"].rsplit("-", 1)[1]
    assert env["MACA_VISIBLE_DEVICES"] == "0"
    assert {"/opt/mxdriver", "/opt/maca"} <= set(pod["mounts"]["maca"])


def cambricon_mlu_share(pod: dict[str, Any]) -> None:
    _running(pod, "mlu-node")
    (device,) = _devices(pod, "MLU")
    assert (device["memory"], device["cores"]) == (4096, 25)  # 16 units of 256 MiB, a quarter of the card
    index = int(device["uuid"].rsplit("-", 1)[1])
    assert pod["annotations"]["CAMBRICON_DSMLU_PROFILE"] == f"{index}_25_16"
    assert pod["env"]["infer"] == {"CAMBRICON_VISIBLE_DEVICES": str(index)}


def enflame_gcu(pod: dict[str, Any]) -> None:
    _running(pod, "enflame-node")
    (device,) = _devices(pod, "GCU")
    assert (device["memory"], device["cores"]) == (42976, 100)  # the whole card, as the node registers it
    index = device["uuid"].rsplit("-", 1)[1]  # the inventory's TR1V5710050-<index>
    assert pod["env"]["tops"]["ENFLAME_VISIBLE_DEVICES"] == index
    assert pod["device_nodes"]["tops"] == [f"/dev/gcu{index}", "/dev/gcuctl"]


def biren_card(pod: dict[str, Any]) -> None:
    _running(pod, "biren-node")
    (device,) = _devices(pod, "Biren")
    assert (device["memory"], device["cores"]) == (0, 0)  # HAMi records neither for a Biren card
    assert pod["env"]["supa"]["BR_PHY_CARDS"] == device["uuid"]
    assert pod["device_nodes"]["supa"] == [f"/dev/biren/{device['uuid']}"]


def amd_share(pod: dict[str, Any]) -> None:
    _running(pod, "amd-node")
    (device,) = _devices(pod, "AMD")
    # 25 % of an MI300X's 304 compute units is 76 (HAMi's floor), the first 76 of the GPU: no other container has any
    assert (device["memory"], device["cores"], device["cores_total"]) == (16384, 76, 304)
    facts = _driver(device["uuid"])
    env = pod["env"]["rocm"]
    assert (env["ROCR_VISIBLE_DEVICES"], env["HSA_CU_MASK"]) == (facts["rocrUuid"], "0:0-75")
    assert env["HIP_DEVICE_MEMORY_LIMIT"] == "16384m"
    assert pod["device_nodes"]["rocm"] == [
        "/dev/kfd",
        f"/dev/dri/card{facts['card']}",
        f"/dev/dri/renderD{facts['render']}",
    ]
    assert json.loads(pod["annotations"]["hami.io/amd-cu-allocated"]) == {device["uuid"]: "0-75"}


def kunlun_vxpu(pod: dict[str, Any]) -> None:
    # admission rounds the memory up to a P800 quarter, as HAMi's; the vXPU is Kunlunxin's plugin's to make
    assert "kunlunxin.com/vxpu-memory=24576" in pod["admission"], pod["admission"]
    _running(pod, "xpu-node")
    (device,) = _devices(pod, "XPU")
    assert (device["memory"], device["cores"]) == (24576, 25)
    assert pod["env"] == {}  # no edits of this project's: the node side is Kunlunxin's


def vastai_dies(pod: dict[str, Any]) -> None:
    _running(pod, "va-node")
    devices = _devices(pod, "Vastai")
    # two dies of one card (HAMi's best combination), asking no memory or cores; the dies are Vastai's plugin's
    assert len({d["uuid"].rsplit("-die-", 1)[0] for d in devices}) == 1, devices
    assert [(d["memory"], d["cores"]) for d in devices] == [(0, 0), (0, 0)]
    assert pod["env"] == {}


def too_big(pod: dict[str, Any]) -> None:
    assert (pod["outcome"], pod["step"]) == ("unschedulable", "filter"), pod
    assert "100000 MiB" in pod["failed_nodes"]["gpu-node"]
    assert pod["failed_nodes"]["ascend-node"] == "no NVIDIA devices registered"


def privileged(pod: dict[str, Any]) -> None:
    assert (pod["outcome"], pod["step"]) == ("refused", "admission"), pod
    assert "privileged" in pod["reason"]


EXPECTED: dict[str, Callable[[dict[str, Any]], None]] = {
    "default/nvidia-memory": nvidia_memory,
    "default/nvidia-percentage": nvidia_percentage,
    "default/nvidia-cores": nvidia_cores,
    "default/nvidia-multi-gpu": nvidia_multi_gpu,
    "default/nvidia-selectors": nvidia_selectors,
    "default/nvidia-numa": nvidia_numa,
    "default/nvidia-topology": nvidia_topology,
    "default/nvidia-mig": nvidia_mig,
    "team-a/quota-first": quota_first,
    "team-a/quota-second": quota_second,
    "default/ascend-template": ascend_template,
    "default/ascend-soft-split": ascend_soft_split,
    "default/ascend-whole-cards": ascend_whole_cards,
    "default/too-big": too_big,
    "default/privileged": privileged,
    "default/hygon-vdcu": hygon_vdcu,
    "default/iluvatar-share": iluvatar_share,
    "default/metax-sgpu": metax_sgpu,
    "default/mthreads-sgpu": mthreads_sgpu,
    "default/amd-share": amd_share,
    "default/kunlun-vxpu": kunlun_vxpu,
    "default/vastai-dies": vastai_dies,
    "default/cambricon-mlu-share": cambricon_mlu_share,
    "default/enflame-gcu": enflame_gcu,
    "default/biren-card": biren_card,
}


def test_every_example_pod_has_an_expectation() -> None:
    pods = [pod.key for example in load_examples(EXAMPLES / "pods") for pod in example.pods]
    assert sorted(pods) == sorted(EXPECTED)


@pytest.mark.parametrize("key", list(EXPECTED))
def test_example_pod_outcome(demo: Demo, key: str) -> None:
    try:
        EXPECTED[key](demo.pod(key))
    except AssertionError:
        print(demo.logs())
        raise


def test_the_demo_succeeds_with_one_json_line_and_reports_every_pod_in_file_order(demo: Demo) -> None:
    assert demo.status == 0, demo.logs()
    assert len(demo.stdout.strip().splitlines()) == 1
    assert [f"{p['namespace']}/{p['name']}" for p in demo.report["pods"]] == list(EXPECTED)
    assert demo.report["summary"] == "25 pods: 22 running, 2 refused, 1 unschedulable"
    assert demo.report["notes"] == []  # no pod failed at Allocate: the inventory gives the vendors their facts


def test_every_placed_pod_is_in_the_final_device_table_and_no_lock_is_left(demo: Demo) -> None:
    status = demo.report["status"]
    sharing = {(p["namespace"], p["name"]) for n in status["nodes"] for d in n["devices"] for p in d["pods"]}
    placed = {(p["namespace"], p["name"]) for p in demo.report["pods"] if p["node"]}
    assert sharing == placed
    assert all(n["lock"] is None for n in status["nodes"])
    failed = [(p["name"], p["node"]) for p in demo.report["pods"] if p["outcome"] == "failed"]
    waiting = sorted((w["name"], w["node"], w["phase"]) for w in status["waiting"])
    assert waiting == sorted((name, node, "failed") for name, node in failed)
    assert bool(demo.report["notes"]) == bool(failed)
    devices = sum(len(n["devices"]) for n in status["nodes"])
    assert devices == sum(e.repeat for n in INVENTORY.nodes for e in n.devices)


def test_each_device_table_row_adds_up_its_pods(demo: Demo) -> None:
    for node in demo.report["status"]["nodes"]:
        for device in node["devices"]:
            assert device["memory_used"] == sum(p["memory"] for p in device["pods"])
            assert device["cores_used"] == sum(p["cores"] for p in device["pods"])
            assert device["memory_used"] <= device["memory_total"]


def test_the_metrics_urls_are_the_scheduler_and_every_node(demo: Demo) -> None:
    urls = demo.report["metrics"]
    assert set(urls) == {"scheduler", *(n.name for n in INVENTORY.nodes)}
    assert urls["scheduler"].startswith("http://127.0.0.1:")
    # each node daemon on a loopback address of its own (the Node's InternalIP), all on one port
    nodes = [urls[n.name] for n in INVENTORY.nodes]
    assert [u.split("//")[1].split(":")[0] for u in nodes] == [f"127.0.0.{10 + i}" for i in range(len(nodes))]
    assert len({u.rsplit(":", 1)[1] for u in nodes}) == 1
    assert all(u.endswith("/metrics") for u in urls.values())
    assert demo.report["kubeconfig"] is None  # not kept: nothing left to connect to
    assert demo.report["dashboard"] is None
