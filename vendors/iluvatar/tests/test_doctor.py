"""`hami doctor`'s Iluvatar checks against the fake ixML (and another project's libixml.so), failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_ixml_with_its_version_ixsmi_and_the_device_nodes(ix, machine, node) -> None:
    m = machine(ix.Chip("GPU-a"), ix.Chip("GPU-b", minor=1))
    node.device_nodes("iluvatar0", "iluvatar1")
    node.tool("ixsmi", "Timestamp: today\n+----+\n")
    found = node.checks(ix.plugins(m.config(corexPath=str(node.bin))))
    library = found["management library"]
    assert library.status is Status.OK
    assert "driver" in library.detail
    assert "2 device(s)" in library.detail
    assert found["management tool"].status is Status.OK
    assert found["device nodes"].status is Status.OK


def test_another_projects_libixml_is_a_failure_not_a_traceback(ix, machine, node) -> None:
    m = machine(ix.Chip("GPU-a"))
    node.device_nodes("iluvatar0")
    found = node.checks(ix.plugins(m.config(ixmlLibrary=str(ix.fake.not_ixml))))
    assert found["management library"].status is Status.FAILED
    assert "ixmlLibrary" in found["management library"].fix


def test_ixsmi_that_fails_is_a_failure(ix, machine, node) -> None:
    m = machine(ix.Chip("GPU-a"))
    node.device_nodes("iluvatar0")
    node.tool("ixsmi", "", 1)
    assert node.checks(ix.plugins(m.config()))["management tool"].status is Status.FAILED


def test_in_a_container_the_finding_says_the_tool_is_not_read(ix, machine, node) -> None:
    m = machine(ix.Chip("GPU-a"))
    found = node.checks(ix.plugins(m.config()), Grant((DeviceGrant(1 << 30, 0),)))
    assert found["memory the tool reports"].status is Status.WARNING
