"""The node-side backstop over CNDev (hami.testing.backstop's checks): the fake CNDev reports each card's processes
(``cndevGetProcessInfo``, memory in KiB) from the file ``FAKE_CNDEV_PROCESSES`` names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.backstop import BackstopNode, BackstopTests


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, mlu_node: Callable[..., Any]) -> BackstopNode:
        cards = [(f"a1b2c3d4-0000-0000-0000-00000000000{i}", "MLU370-X8", 24576, 8, 1) for i in range(2)]
        uuids = [f"MLU-{card[0]}" for card in cards]
        return BackstopNode(mlu_node(cards), "MLU", uuids, "FAKE_CNDEV_PROCESSES", device_type="MLU370-X8")
