"""`hami doctor`'s Moore Threads checks against the fake MTML and a fake mthreads-gmi, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_mtml_mthreads_gmi_and_the_device_nodes(mthreads_node, fakes, node) -> None:
    machine = mthreads_node(fakes.s4000_server(2))
    node.device_nodes("mtgpu.0", "mtgpu.1", "dri/renderD128")
    found = node.checks(machine.plugins())
    assert found["management library"].status is Status.OK
    assert "2 device(s)" in found["management library"].detail
    assert found["management tool"].status is Status.OK
    assert "2 GPU(s)" in found["management tool"].detail
    assert found["device nodes"].status is Status.OK
    node.runtime_config.write_text('BinaryName = "/usr/bin/mthreads-container-runtime"\n')
    assert node.checks(machine.plugins())["container runtime hook"].status is Status.OK


def test_a_failing_mtml_with_a_working_tool_is_a_warning_and_garbage_from_the_tool_a_failure(
    mthreads_node, fakes, node
) -> None:
    machine = mthreads_node(fakes.s4000_server(1))
    node.device_nodes("mtgpu.0")
    found = node.checks(machine.plugins(mtmlLibrary=str(node.dev / "absent-libmtml.so")))
    assert found["management library"].status is Status.WARNING
    fakes.write_gmi(machine.directory / "bin", "\x1b[31mSegmentation fault\n", 139)
    found = node.checks(machine.plugins(mtmlLibrary=str(node.dev / "absent-libmtml.so")))
    assert found["management library"].status is Status.FAILED
    assert found["management tool"].status is Status.FAILED


def test_in_a_container_mthreads_gmi_is_held_against_the_grant(mthreads_node, fakes, node) -> None:
    machine = mthreads_node(fakes.s4000_server(1))
    found = node.checks(machine.plugins(), Grant((DeviceGrant(8 << 30, 0),)))
    assert found["memory the tool reports"].status is Status.FAILED
    assert "49152 MiB reported, 8192 MiB granted" in found["memory the tool reports"].detail
