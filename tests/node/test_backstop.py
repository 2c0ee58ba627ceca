"""How the node-side backstop (hami.node.backstop) tells a process's pod and container from the kernel's cgroup
record; its checks over each vendor's management library are hami.testing.backstop, run in each vendor's tests."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pluggy

from hami.cluster.memory import MemoryCluster
from hami.isolation.accounting import MAGIC
from hami.node.backstop import Backstop, namespace_pid, owner_of
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins
from hami.testing.backstop import systemd_cgroup

POD_UID = "0b3c5a9e-1f2d-4c6b-9a8e-7d6c5b4a3f21"
CONTAINER_ID = "a" * 64
SIDECAR_ID = "b" * 64


def test_a_cgroup_path_gives_the_pod_and_container_under_both_cgroup_drivers(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(systemd_cgroup(POD_UID, CONTAINER_ID))
    assert owner_of(7, tmp_path) == (POD_UID, CONTAINER_ID)
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "cgroup").write_text(f"0::/kubepods/burstable/pod{POD_UID}/{SIDECAR_ID}\n")
    assert owner_of(8, tmp_path) == (POD_UID, SIDECAR_ID)
    assert owner_of(9, tmp_path) is None  # gone


def test_a_processs_innermost_pid_and_namespace_come_from_its_status_and_ns_link(tmp_path: Path) -> None:
    """The pid map's source (GRANT.md "pids"): the last NSpid field; a record without NSpid (a kernel before 4.1),
    or another process's record, gives nothing rather than a wrong pid."""
    own = namespace_pid(os.getpid())  # the real /proc: this process, in whatever namespace the tests run
    assert own is not None
    assert own == (os.getpid(), os.stat(f"/proc/{os.getpid()}/ns/pid").st_ino)
    for pid, status in ((7, "NSpid:\t7\t3\t1\n"), (8, "Pid:\t8\n"), (9, "NSpid:\t10\t1\n")):
        (tmp_path / str(pid) / "ns").mkdir(parents=True)
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\n{status}")
        (tmp_path / str(pid) / "ns" / "pid").symlink_to("pid:[4026532100]")
    assert namespace_pid(7, tmp_path) == (1, 4026532100)  # nested twice: the innermost is the process's own view
    assert namespace_pid(8, tmp_path) is None
    assert namespace_pid(9, tmp_path) is None
    assert namespace_pid(11, tmp_path) is None  # gone


def _accounting_file(path: Path, tampered: int) -> None:
    """An accounting file of one device (LAYOUT.md) whose device record says `tampered`."""
    data = bytearray(8192)
    struct.pack_into("<QIIIIII", data, 0, MAGIC, 1, 8192, 1024, 1024, 16, 1)
    struct.pack_into("<QQQQ", data, 1024, 6 << 20, 8 << 20, 6 << 20, tampered)  # used, limit, peak, tampered
    path.write_bytes(bytes(data))


def test_a_tampered_count_that_grew_is_one_warning_event_on_the_pod(tmp_path: Path) -> None:
    """A process of the container found the memory figures of its accounting file lowered behind the library's back
    (and refused, and repaired them): the next round records it on the pod, once per growth."""
    file = tmp_path / "main.cache"
    _accounting_file(file, 0)
    container = ServedContainer("team", "trainer", POD_UID, "main", 0, "NVIDIA", (), accounting_file=str(file))
    cluster = MemoryCluster()
    backstop = Backstop(VendorPlugins(pluggy.PluginManager("hami")), cluster, lambda: [container])
    backstop.check()
    assert cluster.events == []
    _accounting_file(file, 2)
    backstop.check()
    backstop.check()
    assert [e["reason"] for e in cluster.events] == ["AccountingTampered"]
    assert "2 time(s)" in cluster.events[0]["message"]
    assert cluster.events[0]["involvedObject"]["name"] == "trainer"
    file.write_bytes(bytes(8192))  # the tenant zeroed it: nothing to read until the library repairs it
    backstop.check()
    assert len(cluster.events) == 1
