"""``hami run`` with libvgpu.so over the fake CUDA driver, the device found by discovery over the fake NVML
(hami.testing.hostrun.HostRunTests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from hami.testing.hostrun import HostRunTests, HostWorld


@pytest.fixture
def host_world(gpu_node: Callable[..., object], tmp_path: Path) -> HostWorld:
    box = {
        "devices": [
            {
                "uuid": "GPU-hostrun-0000-1111-2222-333344445555",
                "name": "Tesla T4",
                "memory_mib": 15360,
                "bus_id": "00000000:3B:00.0",
            }
        ]
    }
    node = gpu_node(box)
    config = tmp_path / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"nvidia": node.config()}}))  # type: ignore[attr-defined]
    env = {
        name: str(node.root / f"nvml.{suffix}")
        for name, suffix in (("FAKE_NVML_LOG", "log"), ("FAKE_NVML_EVENTS", "events"))  # type: ignore[attr-defined]
    }
    env["FAKE_NVML_CONFIG"] = str(node.root / "nvml.json")  # type: ignore[attr-defined]
    return HostWorld(config, env)


class TestHostRun(HostRunTests):
    vendor = "nvidia"
