"""``hami run`` with libamvgpu.so over the fake HIP runtime, the GPU found by discovery over the fake AMD SMI and
sysfs (hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


def _fake_machine() -> ModuleType:
    """``fake_amdsmi/machine.py``, which the AMD tests' conftest.py loaded (by path: it cannot be imported)."""
    return sys.modules["hami_amd_test_machine"]


@pytest.fixture
def host_world(tmp_path: Path) -> HostWorld:
    fake = _fake_machine()
    library = fake.build_fake_amdsmi(tmp_path / "build")
    node = fake.write_machine(tmp_path / "node", library, [fake.gpu(0, card=0, render=128)])
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"amd": node.config(coreSplit="time-slice")}}))
    return HostWorld(config)


class TestHostRun(HostRunTests):
    vendor = "amd"
