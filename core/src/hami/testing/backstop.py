"""The node-side backstop's checks every vendor runs over its fake management library (hami.node.backstop through
the vendor's `hami_device_processes`).

What a tenant does here: its container runs a process the isolation library does not limit (a static binary, a
process that patched the library out), which then holds more device memory than the container was granted. The
driver's count, which the vendor's management library reports per process, shows it. The processes are real (they
are killed for real); the kernel's cgroup record of each one is written into a /proc tree of the test, as the
kubelet's cgroup paths name it, with the ``NSpid:`` line of its status and its ``ns/pid`` link, as the kernel
shows a process of a container's pid namespace from the host.

A vendor's fake management library answers its per-process call (NVML's ``nvmlDeviceGetComputeRunningProcesses``,
DCMI's ``dcmi_get_device_resource_info``, ...) from the file an environment variable names, re-read at every call,
one process a line::

    <device index> <pid> <device memory in bytes>

the device index being the fake's own enumeration order (its first device is 0), the bytes converted by the fake
into whatever unit the vendor's call reports (KiB, MB): so a binding that reads the unit wrong fails these checks.
A vendor subclasses `BackstopTests` in its test module and gives the `backstop_node` fixture::

    class TestBackstop(BackstopTests):
        @pytest.fixture
        def backstop_node(self, ...) -> BackstopNode:
            return BackstopNode(host=..., kind="MLU", uuids=[...], processes_variable="FAKE_CNDEV_PROCESSES")
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from hami.cluster.memory import MemoryCluster
from hami.model import ContainerDevice
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins

__all__ = ["BackstopMachine", "BackstopNode", "BackstopTests", "systemd_cgroup"]

MiB = 1024 * 1024
POD_UID = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
OTHER_POD_UID = "11111111-2222-3333-4444-555555555555"
CONTAINER_ID = "a" * 64
SIDECAR_ID = "b" * 64
CONTAINER_PID_NAMESPACE = 4026532771
"""The inode of the pid namespace the tests' container processes are shown in."""


def systemd_cgroup(pod_uid: str, container_id: str) -> str:
    """The cgroup v2 record (/proc/<pid>/cgroup) of a container of a burstable pod, the kubelet's systemd driver
    under containerd naming it."""
    slice_uid = pod_uid.replace("-", "_")
    return (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
        f"cri-containerd-{container_id}.scope\n"
    )


@dataclass(frozen=True)
class BackstopNode:
    """A vendor's node over its fake management library, as the backstop checks need it."""

    plugins: VendorPlugins
    """The vendor plugins with the vendor's plugin, configured to load the fake."""
    kind: str
    """The common word of the devices the tests grant (`ServedContainer.kind`, the hook's routing)."""
    uuids: Sequence[str]
    """The devices' UUIDs (as discovery reports them) in the fake's index order; at least two."""
    processes_variable: str
    """The environment variable naming the file the fake reads its processes from."""
    device_type: str = ""
    """`ContainerDevice.type` of a granted device (the kind when empty)."""


@dataclass
class BackstopMachine:
    """The fake's process table and the /proc tree of the test, with the real processes standing for the tenants."""

    node: BackstopNode
    root: Path
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def processes_file(self) -> Path:
        return self.root / "device.processes"

    def run(
        self, device: int, mib: int, cgroup: str, inner_pid: int | None = None, namespace: int = CONTAINER_PID_NAMESPACE
    ) -> subprocess.Popen[bytes]:
        """A real process, the driver counting `mib` MiB for it on device `device`, in the cgroup `cgroup` names;
        with `inner_pid`, it is that pid in the pid namespace `namespace` (else it is in the host's alone)."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        self.children.append(child)
        base = self.proc / str(child.pid)
        (base / "ns").mkdir(parents=True)
        (base / "cgroup").write_text(cgroup)
        pids = f"{child.pid}\t{inner_pid}" if inner_pid is not None else f"{child.pid}"
        (base / "status").write_text(f"Name:\tpython3\nPid:\t{child.pid}\nNSpid:\t{pids}\nThreads:\t1\n")
        (base / "ns" / "pid").symlink_to(f"pid:[{namespace if inner_pid is not None else 4026531836}]")
        with self.processes_file.open("a") as f:
            f.write(f"{device} {child.pid} {mib * MiB}\n")
        return child

    def served(self, device: int, mib: int, container: str = "main", index: int = 0) -> ServedContainer:
        """A container of the test's pod granted `mib` MiB of device `device`, its grant directory
        `grant_dir(container)` (made here, as Allocate does)."""
        kind = self.node.kind
        granted = ContainerDevice(uuid=self.node.uuids[device], type=self.node.device_type or kind, usedmem=mib,
                                  usedcores=30)  # fmt: skip
        grant = self.grant_dir(container)
        grant.mkdir(parents=True, exist_ok=True)
        return ServedContainer("team", "train", POD_UID, container, index, kind, (granted,), None, str(grant))

    def grant_dir(self, container: str = "main") -> Path:
        """The host's grant directory of `container` of the test's pod."""
        return self.root / "grants" / f"{POD_UID}_{container}"

    def backstop(self, containers: list[ServedContainer], cluster: Any = None, **settings: Any) -> Backstop:
        config = BackstopSettings(proc_root=self.proc, **settings)
        return Backstop(
            self.node.plugins, cluster or MemoryCluster(), lambda: containers, config, devices=lambda: self.node.uuids
        )

    def stop(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
            child.wait()


def _pod_of_two_containers() -> MemoryCluster:
    """A cluster holding the tests' pod with its containers `main` and `sidecar` and their container ids."""
    cluster = MemoryCluster()
    cluster.create("namespaces", {"metadata": {"name": "team"}})
    statuses = [
        {"name": "main", "containerID": f"containerd://{CONTAINER_ID}"},
        {"name": "sidecar", "containerID": f"containerd://{SIDECAR_ID}"},
    ]
    cluster.create(
        "pods",
        {
            "metadata": {"name": "train", "namespace": "team", "uid": POD_UID},
            "spec": {"containers": [{"name": "main"}, {"name": "sidecar"}]},
            "status": {"containerStatuses": statuses},
        },
    )
    return cluster


class BackstopTests:
    """The backstop over one vendor's management library; subclass it and give the `backstop_node` fixture."""

    @pytest.fixture
    def backstop_node(self) -> BackstopNode:
        raise NotImplementedError("a vendor's BackstopTests subclass gives the backstop_node fixture")

    @pytest.fixture
    def machine(
        self, backstop_node: BackstopNode, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> Iterator[BackstopMachine]:
        assert len(backstop_node.uuids) >= 2, "the backstop checks need a node of two devices at least"
        m = BackstopMachine(backstop_node, tmp_path / "backstop")
        m.root.mkdir()
        m.processes_file.write_text("")
        monkeypatch.setenv(backstop_node.processes_variable, str(m.processes_file))
        yield m
        m.stop()

    def test_a_container_over_its_grant_by_the_drivers_count_is_killed_and_reported(
        self, machine: BackstopMachine
    ) -> None:
        cluster = MemoryCluster()
        stop = machine.backstop([machine.served(1, 4000)], cluster)
        # the tenant's process holds 6000 MiB (its allocations and the context the driver keeps) under a 4000 MiB grant
        escaped = machine.run(1, 6000, systemd_cgroup(POD_UID, CONTAINER_ID))
        (overrun,) = stop.check()
        assert (overrun.used_bytes, overrun.limit_bytes, overrun.pids) == (6000 * MiB, 4000 * MiB, (escaped.pid,))
        assert overrun.device_uuid == machine.node.uuids[1]
        assert overrun.killed
        assert escaped.wait(timeout=10) == -signal.SIGKILL
        (event,) = [e for e in cluster.events if e["reason"] == "DeviceMemoryOverLimit"]
        assert event["type"] == "Warning"
        assert f"held 6000 MiB on device {machine.node.uuids[1]}" in event["message"]
        assert "over the 4000 MiB it was granted" in event["message"]
        metrics = {m.name: m for m in stop.collect()}
        assert [s.value for s in metrics["hami_backstop_overruns"].samples if s.name.endswith("_total")] == [1.0]

    def test_within_the_grant_nothing_happens_and_the_drivers_figure_is_exported(
        self, machine: BackstopMachine
    ) -> None:
        stop = machine.backstop([machine.served(0, 4000)])
        fine = machine.run(0, 3000, systemd_cgroup(POD_UID, CONTAINER_ID))
        assert stop.check() == []
        assert fine.poll() is None
        (used,) = [m for m in stop.collect() if m.name == "hami_backstop_device_memory_bytes"]
        assert [(s.labels["device_uuid"], s.value) for s in used.samples] == [(machine.node.uuids[0], 3000 * MiB)]

    def test_processes_of_one_container_are_summed_per_device(self, machine: BackstopMachine) -> None:
        stop = machine.backstop([machine.served(1, 4000)])
        # two processes of 2500 MiB each: neither alone is over, together they are
        machine.run(1, 2500, systemd_cgroup(POD_UID, CONTAINER_ID))
        machine.run(1, 2500, systemd_cgroup(POD_UID, CONTAINER_ID))
        (overrun,) = stop.check()
        assert (overrun.device_uuid, overrun.used_bytes, len(overrun.pids)) == (machine.node.uuids[1], 5000 * MiB, 2)

    def test_processes_outside_the_pods_this_node_served_are_left_alone(self, machine: BackstopMachine) -> None:
        stop = machine.backstop([machine.served(0, 1000)])
        host_process = machine.run(0, 9000, "0::/system.slice/sshd.service\n")
        other_pod = machine.run(0, 9000, systemd_cgroup(OTHER_POD_UID, CONTAINER_ID))
        assert stop.check() == []
        assert host_process.poll() is None
        assert other_pod.poll() is None

    def test_memory_on_a_device_the_pod_was_not_given_is_over_a_grant_of_nothing(
        self, machine: BackstopMachine
    ) -> None:
        stop = machine.backstop([machine.served(0, 4000)])
        # granted device 0, the tenant's process opens device 1 anyway (a raw device node, a static binary)
        elsewhere = machine.run(1, 100, systemd_cgroup(POD_UID, CONTAINER_ID))
        (overrun,) = stop.check()
        assert (overrun.device_uuid, overrun.used_bytes, overrun.limit_bytes) == (machine.node.uuids[1], 100 * MiB, 0)
        assert elsewhere.wait(timeout=10) == -signal.SIGKILL

    def test_a_placement_naming_no_device_here_is_not_judged_on_other_devices(self, machine: BackstopMachine) -> None:
        # HAMi's scheduler names some whole cards by capacity: the pod's card is device 1 under another name
        granted = machine.served(0, 4000)
        renamed = replace(granted, devices=(granted.devices[0].model_copy(update={"uuid": "node-a-card-1"}),))
        stop = machine.backstop([renamed])
        legitimate = machine.run(1, 3000, systemd_cgroup(POD_UID, CONTAINER_ID))
        assert stop.check() == []
        assert legitimate.poll() is None

    def test_with_kill_off_an_overrun_is_reported_and_the_process_lives(self, machine: BackstopMachine) -> None:
        stop = machine.backstop([machine.served(0, 1000)], kill=False)
        over = machine.run(0, 2000, systemd_cgroup(POD_UID, CONTAINER_ID))
        (overrun,) = stop.check()
        assert not overrun.killed
        assert over.poll() is None

    def test_two_containers_on_one_device_are_told_apart_by_their_container_ids(self, machine: BackstopMachine) -> None:
        cluster = _pod_of_two_containers()
        stop = machine.backstop([machine.served(1, 4000, "main", 0), machine.served(1, 1000, "sidecar", 1)], cluster)
        main = machine.run(1, 3500, systemd_cgroup(POD_UID, CONTAINER_ID))  # within its 4000
        sidecar = machine.run(1, 1500, systemd_cgroup(POD_UID, SIDECAR_ID))  # over its 1000
        (overrun,) = stop.check()
        assert overrun.container.container == "sidecar"
        assert sidecar.wait(timeout=10) == -signal.SIGKILL
        assert main.poll() is None

    def test_each_containers_device_processes_are_mapped_to_their_host_pids_in_its_grant_dir(
        self, machine: BackstopMachine
    ) -> None:
        """The isolation library in a container's pid namespace sees its own pid only; the management library names
        it by its host pid. The round writes the map into the read-only grant directory, and rewrites it only when
        it changed."""
        cluster = _pod_of_two_containers()
        containers = [machine.served(0, 4000, "main", 0), machine.served(0, 4000, "sidecar", 1),
                      machine.served(1, 1000, "idle", 2)]  # fmt: skip
        stop = machine.backstop(containers, cluster)
        first = machine.run(0, 100, systemd_cgroup(POD_UID, CONTAINER_ID), inner_pid=7)
        second = machine.run(0, 100, systemd_cgroup(POD_UID, CONTAINER_ID), inner_pid=12)
        sidecar = machine.run(0, 100, systemd_cgroup(POD_UID, SIDECAR_ID), inner_pid=7, namespace=4026532999)
        machine.run(0, 100, systemd_cgroup(OTHER_POD_UID, CONTAINER_ID), inner_pid=8)  # not served here
        stale = machine.grant_dir("idle") / "pids"
        stale.write_text(f"7 1 {CONTAINER_PID_NAMESPACE}\n")  # left by the daemon before a restart; ended since
        assert stop.check() == []
        main_map = machine.grant_dir("main") / "pids"
        ns = CONTAINER_PID_NAMESPACE
        assert main_map.read_text() == f"7 {first.pid} {ns}\n12 {second.pid} {ns}\n"
        assert (machine.grant_dir("sidecar") / "pids").read_text() == f"7 {sidecar.pid} 4026532999\n"
        assert stale.read_text() == "", "no process of that container runs now"
        assert main_map.stat().st_mode & 0o777 == 0o644
        assert not [p for p in machine.grant_dir("main").iterdir() if p.name != "pids"], "no temporary file left"
        written = main_map.stat().st_ino
        assert stop.check() == []
        assert main_map.stat().st_ino == written, "the same processes: not written again"
        second.kill()
        second.wait()
        machine.processes_file.write_text(
            "".join(line for line in machine.processes_file.read_text().splitlines(keepends=True)
                    if f" {second.pid} " not in line)
        )  # fmt: skip
        assert stop.check() == []
        assert main_map.read_text() == f"7 {first.pid} {ns}\n"
        assert main_map.stat().st_ino != written, "replaced whole (renamed over), never written in place"

    def test_the_vendor_reports_every_device_process_with_the_drivers_figure(self, machine: BackstopMachine) -> None:
        a = machine.run(0, 1234, "0::/system.slice/x.service\n")
        b = machine.run(1, 4321, "0::/system.slice/x.service\n")
        answer = machine.node.plugins.device_processes(machine.node.kind)
        assert answer is not None
        found = sorted((p.device_uuid, p.pid, p.used_bytes) for p in answer)
        assert found == sorted([(machine.node.uuids[0], a.pid, 1234 * MiB), (machine.node.uuids[1], b.pid, 4321 * MiB)])
