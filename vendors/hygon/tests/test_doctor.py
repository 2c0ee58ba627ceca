"""`hami doctor`'s Hygon checks against the fake ROCm SMI and DMI and a fake hy-smi, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_rocm_smi_dmi_hy_smi_and_the_device_nodes(hygon_node, fakes, node) -> None:
    machine = hygon_node(fakes.z100l_server(2))
    node.device_nodes("kfd", "dri/renderD128", "dri/renderD129")
    found = node.checks(machine.plugins())
    assert found["management library"].status is Status.OK
    assert "2 device(s)" in found["management library"].detail
    assert found["virtualization library"].status is Status.OK
    assert found["management tool"].status is Status.OK
    assert "2 DCU(s)" in found["management tool"].detail
    assert found["device nodes"].status is Status.OK
    assert "3 found" in found["device nodes"].detail


def test_without_the_libraries_hy_smi_carries_discovery_and_dmi_is_a_warning(hygon_node, fakes, node) -> None:
    node.device_nodes("kfd")
    found = node.checks(hygon_node(fakes.z100l_server(2)).plugins("hy-smi"))
    assert found["management library"].status is Status.WARNING
    assert found["virtualization library"].status is Status.WARNING


def test_hy_smi_printing_garbage_is_a_failure(hygon_node, fakes, node) -> None:
    node.device_nodes("kfd")
    machine = hygon_node(fakes.z100l_server(1))
    fakes.write_hy_smi(machine.directory / "bin", "Traceback (most recent call last):\n  nonsense\n")
    assert node.checks(machine.plugins())["management tool"].status is Status.FAILED


def test_in_a_container_hy_smi_is_held_against_the_grant(hygon_node, fakes, node) -> None:
    machine = hygon_node(fakes.z100l_server(1))
    total = machine.dcus[0].total >> 20
    assert node.checks(machine.plugins(), Grant((DeviceGrant(total << 20, 0),)))["memory the tool reports"].status is (
        Status.OK
    )
    found = node.checks(machine.plugins(), Grant((DeviceGrant(1024 << 20, 0),)))
    assert found["memory the tool reports"].status is Status.FAILED
