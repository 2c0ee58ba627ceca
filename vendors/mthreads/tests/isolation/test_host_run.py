"""``hami run`` with libvmusa.so over the fake MUSA runtime, the GPU found by discovery over the fake MTML, in the
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
def host_world(mthreads_node: Callable[..., Any], fakes: Any, tmp_path: Path) -> HostWorld:
    node = mthreads_node(fakes.s4000_server(1))
    config = tmp_path / "hami.yaml"
    config.write_text(
        json.dumps({"vendors": {"mthreads": node.config(sharingMode="hami-core", hookPath=str(tmp_path / "hook"))}})
    )
    return HostWorld(config, {"FAKE_MTML_CONFIG": os.environ["FAKE_MTML_CONFIG"]})


class TestHostRun(HostRunTests):
    vendor = "mthreads"
