"""`hami doctor`'s core checks on a node: each over a real file tree, socket or process, each failure a finding."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import hami_vendor_nvidia.plugin as nvidia
from hami import hookimpl, vendorchecks
from hami.doctor import node as checks
from hami.findings import Finding, Status, exit_status, failed, ok, probe, render, warning
from hami.model import AnnotationKeys, DeviceKind, ResourceNames, VendorInfo
from hami.node.hooklib import IsolationLibraries, library_source
from hami.plugins import VendorPlugins

UID = "0b7c6a2e-9d1f-4c3a-8e2b-5f6a7b8c9d0e"


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[Path]:
    """A directory with a unix socket that accepts connections at kubelet.sock."""
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(directory / "kubelet.sock"))
    server.listen(64)
    yield directory
    server.close()


def test_a_listening_kubelet_socket_is_ok_and_each_way_it_can_be_wrong_is_a_failure(listening: Path) -> None:
    assert checks.kubelet_socket(listening).status is Status.OK
    assert "does not exist" in checks.kubelet_socket(listening / "absent").detail
    (listening / "kubelet.sock").unlink()
    assert checks.kubelet_socket(listening).status is Status.FAILED
    (listening / "kubelet.sock").write_text("")
    assert "not a socket" in checks.kubelet_socket(listening).detail
    (listening / "kubelet.sock").unlink()
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(listening / "kubelet.sock"))  # bound, never listening: connections are refused
    try:
        finding = checks.kubelet_socket(listening)
    finally:
        dead.close()
    assert finding.status is Status.FAILED
    assert "refuses connections" in finding.detail


def test_registration_reads_the_plugin_sockets_and_the_kubelets_checkpoint(listening: Path) -> None:
    [finding] = checks.registration(listening)
    assert finding.status is Status.FAILED
    assert "no hami-*.sock" in finding.detail
    served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    served.bind(str(listening / "hami-nvidia.com_gpu.sock"))
    served.listen(64)
    try:
        [finding] = checks.registration(listening)
        assert finding.status is Status.WARNING
        assert "kubelet_internal_checkpoint" in finding.detail
        checkpoint = listening / checks.CHECKPOINT
        checkpoint.write_text(json.dumps({"Data": {"PodDeviceEntries": None, "RegisteredDevices": {}}}))
        [finding] = checks.registration(listening)
        assert finding.status is Status.FAILED
        assert "lists no nvidia.com/gpu" in finding.detail
        checkpoint.write_text(json.dumps({"Data": {"RegisteredDevices": {"nvidia.com/gpu": ["GPU-a"]}}}))
        [finding] = checks.registration(listening)
        assert finding.status is Status.OK
        assert finding.check == "device plugin registration nvidia.com/gpu"
        checkpoint.write_text("{not json")
        assert checks.registration(listening)[0].status is Status.WARNING
    finally:
        served.close()
    [finding] = checks.registration(listening)  # the socket file is left, nobody listens: a stale plugin
    assert finding.status is Status.FAILED
    assert "refuses connections" in finding.detail


def test_the_hook_directory_must_be_roots_and_no_one_elses(tmp_path: Path) -> None:
    me = os.getuid()
    assert checks.hook_directory(tmp_path, owner=me).status is Status.OK
    tmp_path.chmod(0o777)
    assert "writable by others" in checks.hook_directory(tmp_path, owner=me).detail
    assert "owned by uid" in checks.hook_directory(tmp_path, owner=me + 1).detail
    assert checks.hook_directory(tmp_path / "absent").status is Status.FAILED


def _installed(hook_dir: Path) -> VendorPlugins:
    plugins = VendorPlugins.from_plugins({"nvidia": nvidia})
    libraries = IsolationLibraries(hook_dir)
    vendor = plugins.vendor("nvidia")
    if library_source(vendor) is None:
        pytest.skip("the NVIDIA package ships no built libvgpu.so here (make install builds it)")
    libraries.install(vendor)
    return plugins


def test_an_installed_preload_file_naming_a_library_that_loads_is_ok(tmp_path: Path) -> None:
    plugins = _installed(tmp_path / "hook")
    (tmp_path / "etc").mkdir()
    findings = checks.preload_files(plugins, tmp_path / "hook", etc=tmp_path / "etc", owner=os.getuid())
    by_check = {(f.vendor, f.check): f for f in findings}
    assert by_check[("nvidia", "ld.so.preload for containers")].status is Status.OK
    assert by_check[("", "host /etc/ld.so.preload")].status is Status.OK


def test_a_preload_file_naming_a_broken_library_or_the_hosts_own_naming_ours_is_reported(tmp_path: Path) -> None:
    plugins = _installed(tmp_path / "hook")
    library = tmp_path / "hook" / "nvidia" / "libvgpu.so"
    library.unlink()
    library.write_bytes(b"\x7fELF" + b"\0" * 60)  # an ELF header and nothing loadable behind it
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "ld.so.preload").write_text(f"{library}\n")
    findings = checks.preload_files(plugins, tmp_path / "hook", etc=tmp_path / "etc", owner=os.getuid())
    by_check = {(f.vendor, f.check): f for f in findings}
    broken = by_check[("nvidia", "ld.so.preload for containers")]
    assert broken.status is Status.FAILED
    assert "does not load" in broken.detail
    assert by_check[("", "host /etc/ld.so.preload")].status is Status.WARNING
    library.write_text("not a library")
    broken = checks.preload_files(plugins, tmp_path / "hook", etc=tmp_path / "etc", owner=os.getuid())[0]
    assert "no ELF header" in broken.detail


def _process(proc: Path, pid: int, cgroup: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "status").write_text(f"Name:\tx\nNSpid:\t{pid}\n")


def test_the_cgroup_layout_maps_processes_to_pods_and_needs_the_hosts_pid_namespace(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    _process(proc, 1, "0::/init.scope\n")
    _process(
        proc,
        40,
        f"0::/kubepods.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{'a' * 64}.scope\n",
    )
    finding = checks.cgroup_layout(proc, tmp_path)
    assert finding.status is Status.OK
    assert "1 pod(s)" in finding.detail
    (proc / "40" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    assert checks.cgroup_layout(proc, tmp_path).status is Status.WARNING
    (proc / "1" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{'b' * 64}\n")
    finding = checks.cgroup_layout(proc, tmp_path)
    assert finding.status is Status.FAILED
    assert "hostPID" in finding.fix


def test_the_placement_key_is_read_from_where_the_environment_says(tmp_path: Path) -> None:
    assert checks.placement_key({}).status is Status.WARNING
    assert checks.placement_key({"HAMI_PLACEMENT_KEYS": str(tmp_path)}).status is Status.FAILED
    (tmp_path / "current").write_bytes(os.urandom(32).hex().encode())
    assert checks.placement_key({"HAMI_PLACEMENT_KEYS": str(tmp_path)}).status is Status.OK
    (tmp_path / "current").write_text("short")
    assert checks.placement_key({"HAMI_PLACEMENT_KEYS": str(tmp_path)}).status is Status.FAILED


@pytest.mark.parametrize(
    ("skew", "status"), [(0, Status.OK), (12, Status.WARNING), (-12, Status.WARNING), (120, Status.FAILED)]
)
def test_the_clock_is_judged_against_the_api_servers_time(skew: int, status: Status) -> None:
    local = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
    finding = checks.clock(lambda: local - timedelta(seconds=skew), now=lambda: local)
    assert finding.status is status
    assert ("ahead of" if skew > 0 else "behind") in finding.detail


def test_an_api_server_that_cannot_be_reached_is_a_warning_not_a_traceback() -> None:
    def unreachable() -> datetime:
        raise ConnectionRefusedError(111, "Connection refused")

    assert checks.clock(unreachable).status is Status.WARNING
    assert checks.clock(None).status is Status.WARNING


def test_a_check_that_raises_becomes_a_failed_finding_naming_it() -> None:
    def broken() -> Finding:
        raise KeyError("surprise")

    [finding] = probe("broken check", broken)
    assert finding.status is Status.FAILED
    assert finding.check == "broken check"
    assert "KeyError" in finding.detail


class _Buggy:
    @hookimpl
    def hami_vendor_info(self) -> VendorInfo:
        keys = AnnotationKeys(
            node_register="hami.io/node-buggy-register",
            node_handshake="hami.io/node-handshake-buggy",
            to_allocate="hami.io/buggy-to-allocate",
            allocated="hami.io/buggy-allocated",
        )
        kind = DeviceKind(common_word="Buggy", resources=ResourceNames(count="buggy.example/dev"), annotations=keys)
        return VendorInfo(name="buggy", display_name="Buggy", kinds=(kind,))

    @hookimpl
    def hami_doctor_checks(self) -> list[Finding]:
        raise RuntimeError("the vendor's own bug")


def test_a_vendor_whose_checks_raise_gets_one_failed_finding_and_the_others_still_report() -> None:
    plugins = VendorPlugins.from_plugins({"buggy": _Buggy(), "nvidia": nvidia})
    findings = plugins.doctor_checks(None)
    buggy = [f for f in findings if f.vendor == "buggy"]
    assert len(buggy) == 1
    assert buggy[0].status is Status.FAILED
    assert "the vendor's own bug" in buggy[0].detail
    assert any(f.vendor == "nvidia" for f in findings)


def test_exit_status_and_rendering() -> None:
    findings = [ok("a", "fine"), warning("b", "meh", "do b")]
    assert exit_status(findings) == 0
    assert exit_status(findings, strict=True) == 1
    assert exit_status([*findings, failed("c", "bad", "do c")]) == 1
    text = render([*findings, failed("c", "bad", "do c")], "title")
    assert "WARN  b: meh" in text
    assert "-> do c" in text
    assert text.endswith("1 ok, 1 warning(s), 1 failed\n")


def test_with_the_nodes_allocatable_registration_is_judged_by_the_api_servers_record(listening: Path) -> None:
    served = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    served.bind(str(listening / "hami-nvidia.com_gpu.sock"))
    served.listen(64)
    try:
        [finding] = checks.registration(listening, {"nvidia.com/gpu": "20", "cpu": "8"})
        assert finding.status is Status.OK
        assert "20 allocatable" in finding.detail
        [finding] = checks.registration(listening, {"nvidia.com/gpu": "0"})
        assert finding.status is Status.WARNING
        [finding] = checks.registration(listening, {"cpu": "8"})
        assert finding.status is Status.FAILED
        assert "the Node's allocatable lists no nvidia.com/gpu" in finding.detail
    finally:
        served.close()


def test_library_else_tool_asks_the_vendors_own_checks_only_where_there_is_a_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def own() -> Finding:
        asked.append("own")
        return ok("virtualization library", "opened")

    def no_library() -> tuple[str, int]:
        raise OSError("libvendor.so: cannot open shared object file")

    tool = tmp_path / "vendor-smi"
    tool.write_text("#!/bin/sh\necho 2\n")
    tool.chmod(0o755)
    arguments = {"vendor": "Acme", "library": "libvendor.so", "setting": "vendorLibrary", "library_words": "VML",
                 "tool_name": "vendor-smi", "read_tool": lambda exe: "2 device(s)", "tool_memory": lambda: [],
                 "device_patterns": ("acme[0-9]*",), "grants": tmp_path / "grants", "more": [own]}  # fmt: skip
    dev = tmp_path / "dev"
    dev.mkdir()
    monkeypatch.setattr(vendorchecks, "DEV", dev)
    # no library, no device node: there is no driver here, said once; the vendor's own checks are not asked
    nothing = vendorchecks.library_else_tool(None, read_library=no_library, command=str(tmp_path / "no-smi"),
                                             **arguments)  # fmt: skip
    assert asked == []
    assert any("Acme" in f.detail + f.fix for f in nothing)
    # device nodes and the tool, no library: the tool stands in; every check is there, the vendor's own included
    (dev / "acme0").touch()
    found = vendorchecks.library_else_tool(None, read_library=no_library, command=str(tool), **arguments)
    assert asked == ["own"]
    assert [f.check for f in found][-2:] == ["virtualization library", "grant directory"]
    assert "vendor-smi" in found[0].detail + found[0].fix


def _lease(owners: list[dict[str, str]], holder: str = "") -> dict[str, object]:
    return {"metadata": {"name": "hami-node-lock-gpu-1", "ownerReferences": owners}, "spec": {"holderIdentity": holder}}


@pytest.mark.parametrize(
    ("offer", "lease", "status", "words"),
    [
        (
            "ns/hami-node-lock-gpu-1",
            _lease([{"kind": "Pod", "name": "hami-node-x"}], "a/p/u"),
            Status.OK,
            "owned by pod hami-node-x, last taken by a/p/u",
        ),
        (None, None, Status.WARNING, "offers no lock Lease"),
        ("ns/hami-node-lock-gpu-1", None, Status.WARNING, "which does not exist"),
        ("ns/hami-node-lock-gpu-1", _lease([]), Status.WARNING, "owned by no pod"),
    ],
)
def test_the_node_lock_lease_is_offered_present_and_owned_by_the_daemons_pod(
    offer: str | None, lease: dict[str, object] | None, status: Status, words: str
) -> None:
    finding = checks.node_lock(lambda: (offer, lease))
    assert finding.status is status
    assert words in finding.detail
    assert status is Status.OK or finding.fix


def test_a_node_lock_that_cannot_be_read_is_a_warning_not_a_traceback() -> None:
    def refused() -> tuple[str | None, dict[str, object] | None]:
        raise PermissionError("leases is forbidden")

    assert checks.node_lock(refused).status is Status.WARNING
    assert checks.node_lock(None).status is Status.WARNING
