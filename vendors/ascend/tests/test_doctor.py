"""`hami doctor`'s Ascend checks against the fake DCMI and a fake npu-smi, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode

NODES = ("davinci0", "davinci1", "davinci_manager", "devmm_svm", "hisi_hdc")


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_dcmi_npu_smi_and_the_device_nodes(ascend_node, machines, node) -> None:
    machine = ascend_node(machines.b3_server(2))
    node.device_nodes(*NODES)
    found = node.checks(machine.plugins())
    assert found["management library"].status is Status.OK
    assert "2 device(s)" in found["management library"].detail
    assert found["management tool"].status is Status.OK
    assert "2 chip(s): 910B3" in found["management tool"].detail
    assert found["device nodes"].status is Status.OK
    assert found["container runtime hook"].status is Status.WARNING  # no runtime configuration readable
    node.runtime_config.write_text('[...runtimes.ascend.options]\nBinaryName = "/usr/local/Ascend/Ascend-Docker-Runtime'
                                   '/ascend-docker-runtime"\n')  # fmt: skip
    assert node.checks(machine.plugins())["container runtime hook"].status is Status.OK
    node.runtime_config.write_text("[plugins.cri.containerd]\n")
    assert node.checks(machine.plugins())["container runtime hook"].status is Status.FAILED


def test_without_dcmi_discovery_falls_back_to_npu_smi_and_the_finding_says_so(ascend_node, machines, node) -> None:
    node.device_nodes(*NODES)
    found = node.checks(ascend_node(machines.b3_server(2)).plugins("npu-smi"))
    assert found["management library"].status is Status.WARNING
    assert "discovery reads npu-smi instead" in found["management library"].detail


def test_no_dcmi_and_a_failing_npu_smi_are_two_failures(ascend_node, machines, node, npu_smi_writer) -> None:
    node.device_nodes(*NODES)
    machine = ascend_node(machines.b3_server(2))
    npu_smi_writer(machine.directory / "bin", machine.npus, exit_code=3)
    found = node.checks(machine.plugins("npu-smi"))
    assert found["management library"].status is Status.FAILED
    assert found["management tool"].status is Status.FAILED
    assert "dcmiLibrary" in found["management library"].fix


def test_npu_smi_printing_garbage_is_a_failure(ascend_node, machines, node) -> None:
    node.device_nodes(*NODES)
    found = node.checks(ascend_node(machines.b3_server(2)).plugins(npuSmi=str(node.tool("npu-smi", "\x00garbage\n"))))
    assert found["management tool"].status is Status.FAILED


def test_in_a_container_npu_smi_showing_the_whole_chip_is_a_failure(ascend_node, machines, node) -> None:
    plugins = ascend_node(machines.b3_server(1)).plugins()
    found = node.checks(plugins, Grant((DeviceGrant(16384 << 20, 0),)))
    assert found["memory the tool reports"].status is Status.FAILED
    assert "65536 MiB reported, 16384 MiB granted" in found["memory the tool reports"].detail
