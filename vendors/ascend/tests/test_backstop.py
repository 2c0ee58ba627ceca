"""The node-side backstop over DCMI (hami.testing.backstop's checks): the fake DCMI reports each chip's processes
(``dcmi_get_device_resource_info``: host PIDs, bytes) from the file ``FAKE_DCMI_PROCESSES`` names. The backstop
asks per kind: a node with chips of two kinds answers each kind with its own chips' processes only, so no process
is counted twice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.backstop import BackstopNode, BackstopTests

MiB = 1024 * 1024


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, ascend_node: Callable[..., Any], machines: Any) -> BackstopNode:
        node = ascend_node(machines.b3_server(2))
        return BackstopNode(node.plugins(), "Ascend910B3", [n.uuid for n in node.npus], "FAKE_DCMI_PROCESSES")


def test_each_kind_is_answered_with_its_own_chips_processes(
    ascend_node: Callable[..., Any], machines: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    npus = machines.b3_server(1) + machines.p310_cards()
    node = ascend_node(npus)
    plugins = node.plugins()
    table = tmp_path / "processes"
    table.write_text(f"0 101 {1000 * MiB}\n1 202 {2000 * MiB}\n2 303 {3000 * MiB}\n")
    monkeypatch.setenv("FAKE_DCMI_PROCESSES", str(table))
    b3 = plugins.device_processes("Ascend910B3")
    p310 = plugins.device_processes("Ascend310P")
    assert b3 is not None
    assert p310 is not None
    assert [(p.device_uuid, p.pid, p.used_bytes) for p in b3] == [(npus[0].uuid, 101, 1000 * MiB)]
    assert sorted((p.device_uuid, p.pid, p.used_bytes) for p in p310) == [
        (npus[1].uuid, 202, 2000 * MiB),
        (npus[2].uuid, 303, 3000 * MiB),
    ]
