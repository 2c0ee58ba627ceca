"""The node-side backstop over ixML (hami.testing.backstop's checks): the fake ixML reports each GPU's compute
processes (``nvmlDeviceGetComputeRunningProcesses``, NVML's v1 record) from the file ``FAKE_IXML_PROCESSES`` names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hami.testing.backstop import BackstopNode, BackstopTests


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, ix: Any, tmp_path: Path) -> BackstopNode:
        chips = [ix.Chip(f"GPU-4a1f0c2e-0000-0000-0000-00000000000{i}", minor=i, bus=0x8A + i) for i in range(2)]
        machine = ix.write_machine(tmp_path / "machine", ix.fake.ixml, chips)
        return BackstopNode(ix.plugins(machine.config()), "BI-V150", [c.uuid for c in chips], "FAKE_IXML_PROCESSES")
