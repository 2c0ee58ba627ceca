"""Ascend's per-container accounting directory is built through `hami.hostpaths`: hostile names never escape it."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from hami.errors import HamiError
from hami.model import Container, Pod
from hami_vendor_ascend.allocation import release
from hami_vendor_ascend.edits import accounting_dir
from hami_vendor_ascend.settings import AscendSettings


@given(uid=st.text(max_size=80), name=st.text(max_size=80))
def test_the_accounting_directory_stays_under_the_containers_directory(uid: str, name: str) -> None:
    """The tenant hand-writes a pod whose UID or container name holds '/', '..' or other path syntax."""
    settings = AscendSettings()
    pod = Pod(name="p", uid=uid, containers=(Container(name=name),))
    try:
        path = accounting_dir(settings, pod, 0)
    except HamiError as exc:
        message = str(exc)
    else:
        assert str(path.parent) == str(settings.containers_dir)
        assert path.name not in (".", "..")
        return
    assert "cannot name a host path" in message or "is empty" in message or "bytes" in message


def test_release_of_a_pod_with_a_climbing_uid_removes_nothing_outside(tmp_path: Path) -> None:
    """The tenant's pod UID is '../victim' so that the release's glob reaches a sibling directory."""
    settings = AscendSettings(hookPath=tmp_path / "hook")
    settings.containers_dir.mkdir(parents=True)
    victim = tmp_path / "hook" / "victim_0"
    victim.mkdir()
    release(settings, Pod(name="p", uid="../victim"), ())
    assert victim.is_dir()
