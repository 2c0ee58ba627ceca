"""`hami doctor`'s Cambricon checks against the fake CNDev and a fake cnmon, failures included."""

from __future__ import annotations

from pathlib import Path

import pytest

from hami.findings import Status
from hami.isolation.grant import DeviceGrant, Grant
from hami.testing.doctor import DoctorNode

CNMON = """\
+------------------------------------------------------------------------------+
| CNMON v5.10.22                                               Driver v5.10.22 |
+-------------------------------+----------------------+-----------------------+
| Card  VF  Name       Firmware |               Bus-Id | Util        Ecc-Error |
| Fan   Temp      Pwr:Usage/Cap |         Memory-Usage | Mode     Compute-Mode |
|===============================+======================+=======================|
| 0     /   MLU370-X8    v1.1.6 |         0000:13:00.0 | 0%                  0 |
|  0%   28C        107 W/ 250 W |     0 MiB/ 24576 MiB | FULL          Default |
+-------------------------------+----------------------+-----------------------+
"""


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DoctorNode:
    return DoctorNode(tmp_path / "doctor", monkeypatch)


def test_a_working_node_reports_cndev_cnmon_and_the_device_nodes(mlu_node, node) -> None:
    node.device_nodes("cambricon_dev0", "cambricon_ctl")
    node.tool("cnmon", CNMON)
    found = node.checks(mlu_node())
    assert found["management library"].status is Status.OK
    assert "4 device(s)" in found["management library"].detail
    assert found["management tool"].status is Status.OK
    assert "1 card(s)" in found["management tool"].detail
    assert found["device nodes"].status is Status.OK


@pytest.mark.parametrize(("output", "code"), [("garbage\n", 0), ("", 0), ("cnmon: driver not loaded\n", 1)])
def test_cnmon_failing_or_printing_garbage_is_a_failure(mlu_node, node, output, code) -> None:
    node.device_nodes("cambricon_dev0")
    node.tool("cnmon", output, code)
    assert node.checks(mlu_node())["management tool"].status is Status.FAILED


def test_a_missing_cndev_is_a_failure_naming_the_setting(mlu_node, node, tmp_path: Path) -> None:
    node.device_nodes("cambricon_dev0")
    found = node.checks(mlu_node(cndevLibrary=str(tmp_path / "absent" / "libcndev.so")))
    assert found["management library"].status is Status.FAILED
    assert "cndevLibrary" in found["management library"].fix


def test_in_a_container_cnmon_showing_the_whole_card_is_a_failure(mlu_node, node) -> None:
    node.tool("cnmon", CNMON)
    found = node.checks(mlu_node(), Grant((DeviceGrant(4096 << 20, 0),)))
    assert found["memory the tool reports"].status is Status.FAILED
    node.tool("cnmon", CNMON.replace("24576 MiB", "4096 MiB"))
    assert node.checks(mlu_node(), Grant((DeviceGrant(4096 << 20, 0),)))["memory the tool reports"].status is Status.OK
