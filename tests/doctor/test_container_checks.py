"""`hami doctor --container`: the grant, the preloaded library and what a child through su/sudo/ssh keeps, seen from
inside a container as a pod sees it (a private mount namespace with /etc/ld.so.preload and a read-only grant)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hami_vendor_nvidia.plugin as nvidia
from hami.doctor.container import ContainerView, children, grant, preload
from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.node.hooklib import library_source
from hami.plugins import VendorPlugins

GRANT = Grant((DeviceGrant(3000 << 20, 30, "GPU-a"),), policy="force").render()


def _library() -> Path:
    source = library_source(VendorPlugins.from_plugins({"nvidia": nvidia}).vendor("nvidia"))
    if source is None:
        pytest.skip("the NVIDIA package ships no built libvgpu.so here (make install builds it)")
    return source


def test_no_grant_anywhere_is_a_warning_that_the_environment_alone_limits(tmp_path: Path) -> None:
    [finding] = grant(ContainerView(grant_dir=tmp_path / "absent", environ={}))
    assert finding.status is Status.WARNING
    assert "environment alone" in finding.detail


def test_a_grant_directory_without_a_readable_grant_fails_closed(tmp_path: Path) -> None:
    view = ContainerView(grant_dir=tmp_path)
    [finding] = grant(view)
    assert finding.status is Status.FAILED
    assert "refuses every device allocation" in finding.detail
    (tmp_path / "nvidia.grant").write_text("hami-grant 1\ndevice 0 100 50\n")  # no end line: cut short
    [finding] = grant(view)
    assert finding.status is Status.FAILED
    assert "no 'end' line" in finding.detail
    (tmp_path / "nvidia.grant").write_bytes(b"\xff" * 9000)
    assert grant(view)[0].status is Status.FAILED


def test_a_grant_the_container_can_write_is_a_failure(tmp_path: Path) -> None:
    (tmp_path / "nvidia.grant").write_text(GRANT)
    view = ContainerView(grant_dir=tmp_path / "absent", environ={"HAMI_ISOLATION_GRANT_DIR": str(tmp_path)})
    [finding] = grant(view)
    assert finding.status is Status.FAILED
    assert "writable from this container" in finding.detail
    assert view.grants["nvidia"].devices[0].memory_bytes == 3000 << 20


def test_a_library_carried_by_ld_preload_alone_is_lost_by_a_child_with_an_empty_environment(tmp_path: Path) -> None:
    library = _library()
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f01 r-xp 00000000 00:00 1 {library.resolve()}\n")
    view = ContainerView(preload_file=tmp_path / "absent", maps=maps, environ={"LD_PRELOAD": str(library)})
    assert preload(view).status is Status.WARNING
    finding = children(view)
    assert finding.status is Status.FAILED
    assert "/etc/ld.so.preload" in finding.fix


def test_a_preload_naming_a_library_this_process_did_not_load_is_a_failure(tmp_path: Path) -> None:
    library = _library()
    (tmp_path / "preload").write_text(f"{library}\n")
    (tmp_path / "maps").write_text("")
    view = ContainerView(preload_file=tmp_path / "preload", maps=tmp_path / "maps", environ={})
    assert preload(view).status is Status.FAILED
    (tmp_path / "preload").write_text("/nonexistent/libvgpu.so\n")
    assert "not in this container" in preload(view).detail
    (tmp_path / "preload").write_text("")
    assert preload(view).status is Status.FAILED


def _in_a_pod(tmp_path: Path, library: Path, grant_text: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run `command` in a private mount namespace where /etc/ld.so.preload names `library` and /etc/hami/grant is a
    read-only grant directory, as a container given by the node daemon has them."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private mount namespace")
    grants = tmp_path / "grant"
    grants.mkdir()
    (grants / "nvidia.grant").write_text(grant_text)
    (tmp_path / "upper").mkdir()
    (tmp_path / "work").mkdir()
    script = (
        f"mount -t overlay overlay -o lowerdir=/etc,upperdir={tmp_path / 'upper'},workdir={tmp_path / 'work'} /etc"
        f" && printf '%s\\n' {library} > /etc/ld.so.preload && mkdir -p /etc/hami/grant"
        f" && mount --bind {grants} /etc/hami/grant && mount -o remount,bind,ro /etc/hami/grant"
        ' && exec "$@"'
    )
    flags = ["-m"] if os.geteuid() == 0 else ["-r", "-m"]
    done = subprocess.run(
        ["unshare", *flags, "sh", "-c", script, "sh", *command],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if "mount:" in done.stderr and "hami" not in done.stderr:
        pytest.skip(f"this machine does not allow the mounts a pod's view needs: {done.stderr.strip()[:200]}")
    return done


def test_in_a_pods_view_every_container_check_passes_and_a_child_keeps_the_library(tmp_path: Path) -> None:
    library = _library()
    done = _in_a_pod(tmp_path, library, GRANT, [sys.executable, "-m", "hami.cli", "doctor", "--container", "--json"])
    report = json.loads(done.stdout)
    found = {f["check"]: f for f in report["findings"] if not f["vendor"]}
    assert found["grant nvidia"]["status"] == "ok"
    assert "3000 MiB, 30 % cores" in found["grant nvidia"]["detail"]
    assert found["isolation library"]["status"] == "ok", found["isolation library"]
    assert found["children through su/sudo/ssh"]["status"] == "ok", found["children through su/sudo/ssh"]
    nvidia_smi = [f for f in report["findings"] if f["vendor"] == "nvidia"]
    assert nvidia_smi
    assert nvidia_smi[0]["check"] == "memory the tool reports"
    assert report["exit"] == done.returncode == 0, done.stderr


def test_in_a_pods_view_a_broken_grant_is_a_failure_with_exit_status_1(tmp_path: Path) -> None:
    done = _in_a_pod(
        tmp_path, _library(), "hami-grant 2\n", [sys.executable, "-m", "hami.cli", "doctor", "--container"]
    )
    assert done.returncode == 1, done.stderr
    assert "FAIL  grant nvidia" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
