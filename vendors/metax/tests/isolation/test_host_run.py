"""``hami run`` with libvmaca.so over the fake MACA runtime, the card found by discovery over the fake MXSML, in the
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
def host_world(metax_node: Callable[..., Any], fakes: Any, tmp_path: Path) -> HostWorld:
    node = metax_node(fakes.c500_server(1))
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"metax": node.config(sgpuMode="hami-core")}}))
    return HostWorld(config, {"FAKE_MXSML_CONFIG": os.environ["FAKE_MXSML_CONFIG"]})


class TestHostRun(HostRunTests):
    vendor = "metax"
