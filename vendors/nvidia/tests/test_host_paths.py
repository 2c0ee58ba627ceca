"""NVIDIA's per-container host directory is built through `hami.hostpaths`: hostile names never escape it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hami.errors import HamiError
from hami.model import Container, Pod
from hami_vendor_nvidia.edits import cache_host_dir
from hami_vendor_nvidia.settings import NvidiaSettings


@given(uid=st.text(max_size=80), name=st.text(max_size=80))
def test_the_accounting_directory_stays_under_the_containers_directory(uid: str, name: str) -> None:
    """The tenant hand-writes a pod whose UID or container name holds '/', '..' or other path syntax."""
    settings = NvidiaSettings()
    base = settings.vgpu_dir / "containers"
    pod = Pod(name="p", uid=uid, containers=(Container(name=name),))
    try:
        path = cache_host_dir(settings, pod, 0)
    except HamiError as exc:
        message = str(exc)
    else:
        assert str(path.parent) == str(base)
        assert path.name not in (".", "..")
        return
    assert "cannot name a host path" in message or "is empty" in message or "bytes" in message
