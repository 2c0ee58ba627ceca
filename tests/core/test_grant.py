"""The grant's writer and reader (hami.isolation.grant): what is written reads back, what is not a grant is refused
with a reason, and the node daemon writes the file whole and read-only to others."""

from __future__ import annotations

import stat
import struct
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.isolation.grant import (
    CONTROL_SIZE,
    GRANT_DIR,
    DeviceGrant,
    Grant,
    GrantError,
    grant_edits,
    parse,
    set_grant_control,
    write_files,
)

devices = st.builds(
    DeviceGrant,
    st.integers(0, (1 << 64) - 1),
    st.integers(0, 100),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=63),
)
grants = st.builds(
    Grant, st.lists(devices, min_size=1, max_size=16).map(tuple), st.sampled_from(["default", "force", "disable"]),
    st.integers(0, 1000), st.booleans(), st.integers(0, (1 << 64) - 1),
)  # fmt: skip


@given(grants)
def test_what_is_written_reads_back(grant: Grant) -> None:
    assert parse(grant.render()) == grant


@given(st.text(max_size=300))
def test_any_text_is_a_grant_or_refused_with_a_reason(text: str) -> None:
    try:
        parse(text)
    except GrantError as exc:
        reason = str(exc)
        assert reason, "a refusal without a reason"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not 'hami-grant 1'"),
        ("hami-grant 1\nend\n", "no device"),
        ("hami-grant 1\ndevice 0 1 0\n", "no 'end' line"),
        ("hami-grant 1\ndevice 1 1 0\nend\n", "device 1 where device 0 was due"),
        ("hami-grant 1\ndevice 0 1 101\nend\n", "'device' is not a grant line"),
        ("hami-grant 1\ndevice 0 1 0\nend\npolicy force\n", "text after 'end'"),
        ("hami-grant 1\r\ndevice 0 1 0\r\nend\r\n", "not 'hami-grant 1'"),  # grant.c splits words on space and tab
    ],
)
def test_what_is_not_a_grant_says_why(text: str, reason: str) -> None:
    with pytest.raises(GrantError, match=reason):
        parse(text)


@pytest.mark.parametrize(
    "grant",
    [Grant(()), Grant((DeviceGrant(1, 101),)), Grant((DeviceGrant(1, 0, "has space"),)),
     Grant((DeviceGrant(1, 0),), policy="off"), Grant((DeviceGrant(-1, 0),)),
     Grant((DeviceGrant(1, 0),), context_bytes=-1)],
)  # fmt: skip
def test_a_grant_the_library_could_not_read_is_not_written(grant: Grant) -> None:
    with pytest.raises(GrantError):
        grant.render()


def test_the_node_daemon_writes_the_grant_whole_and_read_only_to_others(tmp_path: Path) -> None:
    grant = Grant((DeviceGrant(3 << 30, 30, "GPU-1"),))
    mount, files = grant_edits(PurePosixPath(tmp_path / "grants" / "uid_c"), "nvidia", grant)
    assert (mount.container_path, mount.read_only) == (GRANT_DIR, True)
    write_files(files)
    write_files(files)  # a repeated Allocate rewrites it in place
    path = tmp_path / "grants" / "uid_c" / "nvidia.grant"
    assert parse(path.read_text()) == grant
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["nvidia.control", "nvidia.grant"]  # no temporary left
    assert (path.parent / "nvidia.control").read_bytes() == bytes(CONTROL_SIZE)
    set_grant_control(path.parent, "nvidia", 3, 1, 12345)
    data = (path.parent / "nvidia.control").read_bytes()
    assert struct.unpack_from("<IIQ", data, 48) == (1, 0, 12345)
    assert data[:48] == bytes(48)
