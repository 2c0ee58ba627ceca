"""`hami.isolation.hostdirs`: a soft-mode container's accounting directory and grant directory stay inside their
directories whatever the pod's names, are prepared writable and removed with the pod, and the library mounts say
what to set when there is no library."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from hami.errors import HamiError
from hami.isolation import hostdirs
from hami.model import IsolationLibrary, Pod


def pod(uid: str, container: str = "c") -> Pod:
    return Pod.model_validate({"name": "p", "namespace": "ns", "uid": uid, "containers": [{"name": container}]})


def test_directories_are_prepared_writable_and_released_with_their_pod(tmp_path: Path) -> None:
    made = hostdirs.prepare_accounting_dir(tmp_path / "containers", pod("u-1"), 0)
    (made / "old.cache").write_text("left by an earlier container")
    again = hostdirs.prepare_accounting_dir(tmp_path / "containers", pod("u-1"), 0)
    assert again == tmp_path / "containers" / "u-1_c"
    assert list(again.iterdir()) == []  # emptied
    assert stat.S_IMODE(again.stat().st_mode) == 0o777
    hostdirs.prepare_accounting_dir(tmp_path / "containers", pod("u-2"), 0)
    assert hostdirs.grant_dir(tmp_path, pod("u-1"), 0) == tmp_path / "grants" / "u-1_c"
    hostdirs.release_pod(pod("u-1"), [tmp_path / "containers", tmp_path / "grants"])
    assert [p.name for p in (tmp_path / "containers").iterdir()] == ["u-2_c"]


@pytest.mark.parametrize(("uid", "container"), [("../../etc", "c"), ("u", "../x"), ("*", "c"), ("..", "c")])
def test_hostile_names_reach_nothing(tmp_path: Path, uid: str, container: str) -> None:
    (tmp_path / "containers" / "victim_c").mkdir(parents=True)
    with pytest.raises(HamiError, match="pod ns/p: cannot prepare its accounting directory"):
        hostdirs.prepare_accounting_dir(tmp_path / "containers", pod(uid, container), 0)
    hostdirs.release_pod(pod(uid, container), [tmp_path / "containers"])
    assert (tmp_path / "containers" / "victim_c").is_dir()


def test_library_mounts_come_from_the_setting_or_the_daemon_and_else_say_what_to_set() -> None:
    installed = IsolationLibrary(path="/var/lib/hami/x/libvx.so", preload_path="/var/lib/hami/x/ld.so.preload")
    mounts = hostdirs.library_mounts(installed, None, "libvx.so", "x.libraryDir")
    assert [(m.container_path, m.host_path) for m in mounts] == [
        ("/var/lib/hami/x/libvx.so", "/var/lib/hami/x/libvx.so"),
        ("/etc/ld.so.preload", "/var/lib/hami/x/ld.so.preload"),
    ]
    chosen = hostdirs.library_mounts(installed, Path("/opt/x"), "libvx.so", "x.libraryDir")
    assert [m.host_path for m in chosen] == ["/opt/x/libvx.so", "/opt/x/ld.so.preload"]
    assert all(m.read_only for m in chosen)
    with pytest.raises(HamiError, match=r"needs libvx\.so: .* and x\.libraryDir is not set"):
        hostdirs.library_mounts(None, None, "libvx.so", "x.libraryDir")
