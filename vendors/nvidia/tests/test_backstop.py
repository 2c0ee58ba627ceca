"""The node-side backstop over NVML (hami.node.backstop through hami_device_processes), with the fake NVML.

What a tenant does here: its container runs a process the isolation library does not limit (a static binary, a
process that patched the library out), which then holds more device memory than the container was granted. The
driver's count, which NVML reports per process, shows it. The processes are real (they are killed for real); the
kernel's cgroup record of each one is written into a /proc tree of the test, as the kubelet's cgroup paths name it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hami.cluster.memory import MemoryCluster
from hami.model import ContainerDevice
from hami.node.backstop import Backstop, BackstopSettings, owner_of
from hami.node.pods import ServedContainer

MiB = 1024 * 1024
POD_UID = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
CONTAINER_ID = "a" * 64
SIDECAR_ID = "b" * 64


def systemd_path(pod_uid: str, container_id: str) -> str:
    """The cgroup v2 path the kubelet's systemd driver gives a container of a burstable pod under containerd."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


class Machine:
    def __init__(self, node: Any, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.node = node
        self.proc = root / "proc"
        self.processes_file = root / "nvml.processes"
        self.processes_file.write_text("")
        monkeypatch.setenv("FAKE_NVML_PROCESSES", str(self.processes_file))
        self.children: list[subprocess.Popen[bytes]] = []

    def run(self, gpu: int, mib: int, cgroup: str) -> subprocess.Popen[bytes]:
        """A real process, NVML counting `mib` MiB for it on GPU `gpu`, in the cgroup `cgroup` names."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.children.append(child)
        (self.proc / str(child.pid)).mkdir(parents=True)
        (self.proc / str(child.pid) / "cgroup").write_text(cgroup)
        with self.processes_file.open("a") as f:
            f.write(f"{gpu} {child.pid} {mib * MiB}\n")
        return child

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait()


@pytest.fixture
def machine(
    gpu_node: Callable[..., Any], boxes: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Machine]:
    m = Machine(gpu_node(boxes.h100()), tmp_path, monkeypatch)
    yield m
    m.stop()


def served(uuid: str, mib: int, container: str = "cuda", index: int = 0) -> ServedContainer:
    device = ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mib, usedcores=30)
    return ServedContainer("team", "train", POD_UID, container, index, "NVIDIA", [device])


def backstop(machine: Machine, containers: list[ServedContainer], cluster: Any = None, **settings: Any) -> Backstop:
    host = machine.node.host()
    config = BackstopSettings(procRoot=machine.proc, **settings)
    return Backstop(host, cluster or MemoryCluster(), lambda: containers, config)


def uuid_of(machine: Machine, index: int) -> str:
    return str(machine.node.box["devices"][index]["uuid"])


def test_a_container_over_its_grant_by_the_drivers_count_is_killed_and_reported(machine: Machine) -> None:
    uuid = uuid_of(machine, 2)
    cluster = MemoryCluster()
    stop = backstop(machine, [served(uuid, 4000)], cluster)
    # the tenant's process holds 6000 MiB (its allocations and the context the driver keeps) under a 4000 MiB grant
    escaped = machine.run(2, 6000, systemd_path(POD_UID, CONTAINER_ID))
    (overrun,) = stop.check()
    assert (overrun.used_bytes, overrun.limit_bytes, overrun.pids) == (6000 * MiB, 4000 * MiB, (escaped.pid,))
    assert overrun.killed
    assert escaped.wait(timeout=10) == -signal.SIGKILL
    (event,) = [e for e in cluster.events if e["reason"] == "DeviceMemoryOverLimit"]
    assert event["type"] == "Warning"
    assert f"held 6000 MiB on device {uuid}" in event["message"]
    assert "over the 4000 MiB it was granted" in event["message"]
    metrics = {m.name: m for m in stop.collect()}
    assert [s.value for s in metrics["hami_backstop_overruns"].samples if s.name.endswith("_total")] == [1.0]


def test_within_the_grant_nothing_happens_and_the_drivers_figure_is_exported(machine: Machine) -> None:
    uuid = uuid_of(machine, 0)
    stop = backstop(machine, [served(uuid, 4000)])
    fine = machine.run(0, 3000, systemd_path(POD_UID, CONTAINER_ID))
    assert stop.check() == []
    assert fine.poll() is None
    (used,) = [m for m in stop.collect() if m.name == "hami_backstop_device_memory_bytes"]
    assert [(s.labels["container"], s.value) for s in used.samples] == [("cuda", 3000 * MiB)]


def test_processes_of_one_container_are_summed(machine: Machine) -> None:
    uuid = uuid_of(machine, 1)
    stop = backstop(machine, [served(uuid, 4000)])
    # two processes of 2500 MiB each: neither alone is over, together they are
    machine.run(1, 2500, systemd_path(POD_UID, CONTAINER_ID))
    machine.run(1, 2500, systemd_path(POD_UID, CONTAINER_ID))
    (overrun,) = stop.check()
    assert overrun.used_bytes == 5000 * MiB
    assert len(overrun.pids) == 2


def test_processes_outside_the_pods_this_node_served_are_left_alone(machine: Machine) -> None:
    uuid = uuid_of(machine, 3)
    stop = backstop(machine, [served(uuid, 1000)])
    host_process = machine.run(3, 9000, "0::/system.slice/sshd.service\n")
    other_pod = machine.run(3, 9000, systemd_path("11111111-2222-3333-4444-555555555555", CONTAINER_ID))
    assert stop.check() == []
    assert host_process.poll() is None
    assert other_pod.poll() is None


def test_with_kill_off_an_overrun_is_reported_and_the_process_lives(machine: Machine) -> None:
    uuid = uuid_of(machine, 4)
    stop = backstop(machine, [served(uuid, 1000)], kill=False)
    over = machine.run(4, 2000, systemd_path(POD_UID, CONTAINER_ID))
    (overrun,) = stop.check()
    assert not overrun.killed
    assert over.poll() is None


def test_two_containers_on_one_device_are_told_apart_by_their_container_ids(machine: Machine) -> None:
    uuid = uuid_of(machine, 5)
    cluster = MemoryCluster()
    cluster.create("namespaces", {"metadata": {"name": "team"}})
    cluster.create(
        "pods",
        {
            "metadata": {"name": "train", "namespace": "team", "uid": POD_UID},
            "spec": {"containers": [{"name": "cuda"}, {"name": "sidecar"}]},
            "status": {
                "containerStatuses": [
                    {"name": "cuda", "containerID": f"containerd://{CONTAINER_ID}"},
                    {"name": "sidecar", "containerID": f"containerd://{SIDECAR_ID}"},
                ]
            },
        },
    )
    containers = [served(uuid, 4000, "cuda", 0), served(uuid, 1000, "sidecar", 1)]
    stop = backstop(machine, containers, cluster)
    main = machine.run(5, 3500, systemd_path(POD_UID, CONTAINER_ID))  # within its 4000
    sidecar = machine.run(5, 1500, systemd_path(POD_UID, SIDECAR_ID))  # over its 1000
    (overrun,) = stop.check()
    assert overrun.container.container == "sidecar"
    assert sidecar.wait(timeout=10) == -signal.SIGKILL
    assert main.poll() is None


def test_a_cgroup_path_gives_the_pod_and_container_under_both_cgroup_drivers(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(systemd_path(POD_UID, CONTAINER_ID))
    assert owner_of(7, tmp_path) == (POD_UID, CONTAINER_ID)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text(f"0::/kubepods/burstable/pod{POD_UID}/{SIDECAR_ID}\n")
    assert owner_of(8, tmp_path) == (POD_UID, SIDECAR_ID)
    assert owner_of(9, tmp_path) is None  # gone
