"""The node-side backstop over NVML (hami.testing.backstop's checks): the fake NVML reports the compute processes
of each GPU (``nvmlDeviceGetComputeRunningProcesses_v3``) from the file ``FAKE_NVML_PROCESSES`` names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.backstop import BackstopNode, BackstopTests


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, gpu_node: Callable[..., Any], boxes: Any) -> BackstopNode:
        node = gpu_node(boxes.h100())
        uuids = [str(d["uuid"]) for d in node.box["devices"]]
        return BackstopNode(node.plugins(), "NVIDIA", uuids, "FAKE_NVML_PROCESSES")
