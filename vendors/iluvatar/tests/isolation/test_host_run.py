"""``hami run`` with libvcorex.so over the fake CoreX driver, the chip found by discovery over the fake ixML, in the
hami-core mode (the one that uses the library) (hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


@pytest.fixture
def host_world(machine: Callable[..., Any], ix: Any, tmp_path: Path) -> HostWorld:
    node = machine(ix.Chip(uuid="GPU-hostrun-bi-v150-0", memory_mib=32768))
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"iluvatar": node.config(iluvatarMode="hami-core")}}))
    return HostWorld(config)


class TestHostRun(HostRunTests):
    vendor = "iluvatar"
