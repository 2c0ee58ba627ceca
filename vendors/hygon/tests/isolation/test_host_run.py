"""``hami run`` with libvdcu.so over the fake HIP runtime, the DCU found by discovery over the fake ROCm SMI, in
the soft mode (the one that uses the library) (hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


@pytest.fixture
def host_world(hygon_node: Callable[..., Any], fakes: Any, tmp_path: Path) -> HostWorld:
    node = hygon_node(fakes.z100l_server()[:1])
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"hygon": node.config(dcuMode="hami-core")}}))
    return HostWorld(config, {name: os.environ[name] for name in ("FAKE_DTK_CONFIG", "FAKE_DTK_STATE")})


class TestHostRun(HostRunTests):
    vendor = "hygon"
