"""``hami run`` with libvmlu.so over the fake CNDrv and CNRT, the MLU found by discovery over the fake CNDev, in the
hami-core mode (the one that uses the library) (hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


@pytest.fixture
def host_world(mlu_node: Callable[..., Any], tmp_path: Path) -> HostWorld:
    plugins = mlu_node([("a1b2c3d4-0000-0000-0000-hostrun00000", "MLU370-X8", 24576, 8, 1)])  # writes the machine
    fake_cndev = plugins.vendor("cambricon").settings.cndev_library
    config = tmp_path / "hami.yaml"
    section = {"cndevLibrary": fake_cndev, "mluMode": "hami-core", "hookPath": str(tmp_path / "hook")}
    config.write_text(json.dumps({"vendors": {"cambricon": section}}))
    return HostWorld(config, {name: os.environ[name] for name in ("FAKE_CNDEV_CONFIG", "FAKE_CNDEV_STATE")})


class TestHostRun(HostRunTests):
    vendor = "cambricon"
