"""`hami doctor`'s NVIDIA checks against the fake NVML and a fake nvidia-smi, failures included."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hami import isolation
from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode
from hami_vendor_nvidia import doctor


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def smi(*rows: tuple[int, str, int]) -> str:
    return "".join(f"{i}, {uuid}, 550.54.15, {mib}\n" for i, uuid, mib in rows)


def test_a_working_node_reports_nvml_the_tool_the_driver_and_the_devices(gpu_node, boxes, node: DoctorNode) -> None:
    machine = gpu_node(boxes.h100())
    node.device_nodes("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm")
    node.tool("nvidia-smi", smi((0, "GPU-a", 81559), (1, "GPU-b", 81559)))
    found = node.checks(machine.plugins())
    assert found["management library"].status is Status.OK
    assert "driver 550.54.15; 8 device(s)" in found["management library"].detail
    assert str(machine.library) in found["management library"].detail
    assert found["management tool"].status is Status.OK
    assert "2 GPU(s)" in found["management tool"].detail
    assert found["CUDA driver against the hooks"].status is Status.OK
    assert found["device nodes"].status is Status.OK
    assert "4 found" in found["device nodes"].detail
    assert found["CDI specification"].status is Status.WARNING
    assert all(f.vendor == "nvidia" for f in found.values())


def test_a_driver_newer_than_the_hooks_is_a_failure_and_a_minor_one_a_warning(gpu_node, boxes, node) -> None:
    node.device_nodes("nvidia0")
    found = node.checks(gpu_node({**boxes.h100(), "cuda": 13000}).plugins())
    assert found["CUDA driver against the hooks"].status is Status.FAILED
    assert "13.0" in found["CUDA driver against the hooks"].detail
    found = node.checks(gpu_node({**boxes.h100(), "cuda": 12080}).plugins())
    assert found["CUDA driver against the hooks"].status is Status.WARNING


def test_the_newest_hooked_version_is_the_isolation_librarys_own_table() -> None:
    source = (Path(isolation.__file__).parent / "cuda" / "driver.c").read_text()  # hami-core ships its C sources
    table = source.split("g_variants[] = {", 1)[1].split("};", 1)[0]
    versions = [int(v) for v in re.findall(r"\)\), (\d+), [01],", table)]
    assert versions
    assert max(versions) == doctor.NEWEST_HOOKED_CUDA


def test_a_missing_library_with_device_nodes_present_is_a_failure_naming_the_setting(gpu_node, boxes, node) -> None:
    node.device_nodes("nvidia0", "nvidiactl")
    found = node.checks(gpu_node(boxes.h100()).plugins(nvmlLibrary=str(node.dev / "no-such-libnvidia-ml.so.1")))
    library = found["management library"]
    assert library.status is Status.FAILED
    assert "nvmlLibrary" in library.fix


def test_a_library_that_is_not_nvml_is_a_failure_not_a_traceback(gpu_node, boxes, node, tmp_path: Path) -> None:
    node.device_nodes("nvidia0")
    broken = tmp_path / "libnvidia-ml.so.1"
    broken.write_text("not an ELF file")
    found = node.checks(gpu_node(boxes.h100()).plugins(nvmlLibrary=str(broken)))
    assert found["management library"].status is Status.FAILED


def test_no_driver_and_no_device_node_is_one_finding_saying_this_is_not_an_nvidia_node(gpu_node, boxes, node) -> None:
    found = node.checks(gpu_node(boxes.h100()).plugins(nvmlLibrary="/nonexistent/libnvidia-ml.so.1"))
    assert list(found) == ["hardware"]
    assert found["hardware"].status is Status.OK


@pytest.mark.parametrize(
    ("output", "exit_code", "status"),
    [
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9, Status.FAILED),
        ("\x00\x01garbage, more garbage\n", 0, Status.FAILED),
        ("", 0, Status.FAILED),
    ],
)
def test_a_tool_that_fails_or_prints_garbage_is_a_failure(gpu_node, boxes, node, output, exit_code, status) -> None:
    node.device_nodes("nvidia0")
    node.tool("nvidia-smi", output, exit_code)
    found = node.checks(gpu_node(boxes.h100()).plugins())
    assert found["management tool"].status is status
    assert found["management tool"].fix


def test_a_device_node_this_process_cannot_open_is_a_failure(gpu_node, boxes, node) -> None:
    node.device_nodes("nvidia0")
    (node.dev / "nvidia1").write_text("a regular file where a device should be")
    found = node.checks(gpu_node(boxes.h100()).plugins())
    assert found["device nodes"].status is Status.FAILED
    assert "not a character device" in found["device nodes"].detail


def test_a_grant_directory_others_can_write_is_a_failure(gpu_node, boxes, node, tmp_path: Path) -> None:
    node.device_nodes("nvidia0")
    machine = gpu_node(boxes.h100())
    grants = machine.root / "hook" / "vgpu" / "grants" / "uid_main"
    grants.mkdir(parents=True)
    grants.chmod(0o777)
    found = node.checks(machine.plugins())
    assert found["grant directory"].status is Status.FAILED
    assert "writable by others" in found["grant directory"].detail


def test_a_cdi_specification_lacking_a_gpu_is_a_failure(gpu_node, boxes, node, tmp_path: Path) -> None:
    node.device_nodes("nvidia0")
    machine = gpu_node(boxes.h100())
    spec = tmp_path / "doctor" / "etc-cdi"
    spec.mkdir()
    (spec / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: '0'\n")
    found = node.checks(machine.plugins())
    assert found["CDI specification"].status is Status.FAILED
    (spec / "nvidia.yaml").write_text("kind: [unclosed\n")
    assert node.checks(machine.plugins())["CDI specification"].status is Status.FAILED


def test_in_a_container_the_memory_nvidia_smi_reports_is_held_against_the_grant(gpu_node, boxes, node) -> None:
    plugins = gpu_node(boxes.h100()).plugins()
    grant = Grant((DeviceGrant(3000 << 20, 30, "GPU-a"),))
    node.tool("nvidia-smi", smi((0, "GPU-a", 3000)))
    assert node.checks(plugins, grant)["memory the tool reports"].status is Status.OK
    node.tool("nvidia-smi", smi((0, "GPU-a", 81559)))
    finding = node.checks(plugins, grant)["memory the tool reports"]
    assert finding.status is Status.FAILED
    assert "81559 MiB reported, 3000 MiB granted" in finding.detail


def test_the_runtime_for_nvidia_visible_devices_is_looked_for_in_the_runtimes_configuration(gpu_node, boxes, node):
    node.device_nodes("nvidia0")
    plugins = gpu_node(boxes.h100()).plugins()
    assert node.checks(plugins)["container runtime hook"].status is Status.WARNING  # no configuration readable
    node.runtime_config.write_text(
        '[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n'
    )
    assert node.checks(plugins)["container runtime hook"].status is Status.FAILED
    node.runtime_config.write_text('[...runtimes.nvidia.options]\n  BinaryName = "/usr/bin/nvidia-container-runtime"\n')
    finding = node.checks(plugins)["container runtime hook"]
    assert finding.status is Status.OK
    assert "nvidia-container-runtime" in finding.detail
    assert "container runtime hook" not in node.checks(gpu_node(boxes.h100()).plugins(deviceListStrategy=["cdi-cri"]))
