"""How the node-side backstop (hami.node.backstop) tells a process's pod and container from the kernel's cgroup
record; its checks over each vendor's management library are hami.testing.backstop, run in each vendor's tests."""

from __future__ import annotations

from pathlib import Path

from hami.node.backstop import owner_of
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
