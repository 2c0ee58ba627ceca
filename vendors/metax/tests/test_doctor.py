"""`hami doctor`'s MetaX checks against the fake MXSML and a fake mx-smi, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_mxsml_mx_smi_and_the_device_nodes(metax_node, fakes, node) -> None:
    machine = metax_node(fakes.c500_server(2))
    node.device_nodes("mxcd", "dri/renderD128", "dri/renderD129")
    found = node.checks(machine.plugins())
    assert found["management library"].status is Status.OK
    assert "2 device(s)" in found["management library"].detail
    assert found["management tool"].status is Status.OK
    assert "2 GPU(s)" in found["management tool"].detail
    assert found["device nodes"].status is Status.OK


def test_without_mxsml_mx_smi_carries_discovery_and_garbage_from_it_is_a_failure(metax_node, fakes, node) -> None:
    machine = metax_node(fakes.c500_server(1))
    node.device_nodes("mxcd")
    assert node.checks(machine.plugins("mx-smi"))["management library"].status is Status.WARNING
    fakes.write_mx_smi(machine.directory / "bin", "garbage\n", "more garbage\n")
    found = node.checks(machine.plugins("mx-smi"))
    assert found["management tool"].status is Status.FAILED
    assert found["management library"].status is Status.FAILED


def test_a_grant_directory_owned_by_someone_else_or_open_to_others_is_a_failure(metax_node, fakes, node) -> None:
    machine = metax_node(fakes.c500_server(1))
    node.device_nodes("mxcd")
    grants = machine.directory / "metax" / "grants"
    (grants / "uid_main").mkdir(parents=True)
    (grants / "uid_main" / "metax.grant").write_text("hami-grant 1\n")
    (grants / "uid_main" / "metax.grant").chmod(0o666)
    found = node.checks(machine.plugins())
    assert found["grant directory"].status is Status.FAILED
    assert "metax.grant" in found["grant directory"].detail


def test_in_a_container_mx_smi_is_held_against_the_grant(metax_node, fakes, node) -> None:
    machine = metax_node(fakes.c500_server(1))
    assert node.checks(machine.plugins(), Grant((DeviceGrant(64 << 30, 0),)))["memory the tool reports"].status is (
        Status.OK
    )
    assert node.checks(machine.plugins(), Grant((DeviceGrant(2 << 30, 0),)))["memory the tool reports"].status is (
        Status.FAILED
    )
