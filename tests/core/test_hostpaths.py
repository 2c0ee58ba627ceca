"""Host paths from pod strings (`hami.hostpaths`): a tenant's hostile names never leave their directory."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.hostpaths import HostPathError, path_component, pod_path

BASE = PurePosixPath("/usr/local/hami/containers")
HOSTILE = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["..", ".", "../../etc", "a/../../b", "/etc/passwd", "x\0y", "..\\..", "a/b", " ", "*", "é"]),
    st.builds(lambda a, b: f"{a}/{b}", st.text(max_size=20), st.text(max_size=20)),
)


@given(uid=HOSTILE, container=HOSTILE)
def test_a_hostile_pod_string_is_refused_or_stays_directly_under_its_directory(uid: str, container: str) -> None:
    """The tenant names its container (or, writing the pod by hand, its UID) to climb out of the directory."""
    try:
        path = pod_path(BASE, (uid, "pod UID"), (container, "container name"))
    except HostPathError as exc:
        message = str(exc)
    else:
        assert path.parent == BASE
        assert path.name == f"{uid}_{container}"
        assert "/" not in path.name
        assert path.name not in (".", "..")
        return
    assert "pod UID" in message or "container name" in message


@pytest.mark.parametrize("value", ["..", ".", "../x", "a/b", "", "a" * 256, "x\0"])
def test_what_cannot_be_a_path_component_is_refused_saying_what(value: str) -> None:
    with pytest.raises(HostPathError, match="container name"):
        path_component(value, "container name")


def test_kubernetes_names_and_uids_are_accepted() -> None:
    uid = "0c6b34f1-5e0a-4f7e-9d8a-2b6f5e1c9a10"
    assert pod_path(BASE, (uid, "pod UID"), ("cuda-main.v2", "container name")) == BASE / f"{uid}_cuda-main.v2"
