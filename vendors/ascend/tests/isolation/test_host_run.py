"""``hami run`` with libvnpu.so over the fake ACL runtime, the NPU found by discovery over the fake DCMI, in the
soft-split mode (the one that uses the library) (hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


@pytest.fixture
def host_world(ascend_node: Callable[..., Any], machines: Any, tmp_path: Path) -> HostWorld:
    node = ascend_node(machines.b3_server(1))
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"ascend": node.config(hamiVnpuMode="hami-core")}}))
    return HostWorld(config, {"FAKE_DCMI_CONFIG": os.environ["FAKE_DCMI_CONFIG"]})


class TestHostRun(HostRunTests):
    vendor = "ascend"
