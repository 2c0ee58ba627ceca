"""The node-side backstop over ROCm SMI (hami.testing.backstop's checks): the fake ROCm SMI reports the compute
processes (``rsmi_compute_process_info_get``, ``rsmi_compute_process_gpus_get``,
``rsmi_compute_process_info_by_device_get``) from the file ``FAKE_DTK_PROCESSES`` names.

ROCm SMI sums a process's VRAM over all its DCUs; what a tenant could try is a process on two DCUs, so that the sum
is held against one grant or the split is unknown. Its VRAM on each DCU is read per device, and where the library
cannot split it (no ``…_by_device_get``), the process is left out rather than counted whole on each DCU (which would
kill a process within both grants)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.backstop import BackstopMachine, BackstopNode, BackstopTests

MiB = 1024 * 1024


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, hygon_node: Callable[..., Any], fakes: Any) -> BackstopNode:
        node = hygon_node(fakes.z100l_server(2))
        return BackstopNode(node.plugins(), "DCU", [d.uuid for d in node.dcus], "FAKE_DTK_PROCESSES")

    def test_a_process_on_two_dcus_is_counted_on_each_with_its_vram_there(self, machine: BackstopMachine) -> None:
        child = machine.run(0, 3000, "0::/system.slice/x.service\n")
        with machine.processes_file.open("a") as f:
            f.write(f"1 {child.pid} {5000 * MiB}\n")
        answer = machine.node.plugins.device_processes("DCU")
        assert answer is not None
        found = sorted((p.device_uuid, p.pid, p.used_bytes) for p in answer)
        uuids = machine.node.uuids
        assert found == [(uuids[0], child.pid, 3000 * MiB), (uuids[1], child.pid, 5000 * MiB)]


class TestBackstopWithAnOlderRocmSmi:
    def test_a_process_on_two_dcus_is_left_out_and_one_on_a_single_dcu_is_counted(
        self, hygon_node: Callable[..., Any], fakes: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        node = hygon_node(fakes.z100l_server(2))
        plugins = node.plugins(rocmSmiLibrary=str(node.dtk.rsmi_old))
        table = tmp_path / "processes"
        table.write_text(f"0 4242 {3000 * MiB}\n1 4242 {5000 * MiB}\n1 4343 {1000 * MiB}\n")
        monkeypatch.setenv("FAKE_DTK_PROCESSES", str(table))
        answer = plugins.device_processes("DCU")
        assert answer is not None
        assert [(p.device_uuid, p.pid, p.used_bytes) for p in answer] == [(node.dcus[1].uuid, 4343, 1000 * MiB)]
