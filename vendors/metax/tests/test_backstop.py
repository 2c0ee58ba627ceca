"""The node-side backstop over MXSML (hami.testing.backstop's checks): the fake MXSML reports each device's
processes (``mxSmlGetSingleGpuProcess``, bytes per GPU a process uses) from the file ``FAKE_MXSML_PROCESSES`` names.
On a node of whole cards (``nodeKind: gpu``) the same, under ``Metax-GPU``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hami.testing.backstop import BackstopNode, BackstopTests


class TestBackstop(BackstopTests):
    @pytest.fixture
    def backstop_node(self, metax_node: Callable[..., Any], fakes: Any) -> BackstopNode:
        node = metax_node(fakes.c500_server(2))
        return BackstopNode(node.plugins(), "Metax-SGPU", [g.uuid for g in node.gpus], "FAKE_MXSML_PROCESSES")


class TestBackstopOnWholeCards(BackstopTests):
    @pytest.fixture
    def backstop_node(self, metax_node: Callable[..., Any], fakes: Any) -> BackstopNode:
        node = metax_node(fakes.c500_server(2))
        plugins = node.plugins(nodeKind="gpu")
        return BackstopNode(plugins, "Metax-GPU", [g.uuid for g in node.gpus], "FAKE_MXSML_PROCESSES")
