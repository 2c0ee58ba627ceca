"""The MetaX plugin's DRM source (`hami_drm_usage_source`), off by default: MetaX does not document its DRM
driver's fdinfo keys or name. Turned on with the ``drm-driver`` and the engines an operator read on the hardware, it
gives the busy share of the cards of the kind this node serves; MXSML's per-process figure stays the backstop's."""

from __future__ import annotations

from typing import Any

ON = {"enabled": True, "drivers": ["metax"], "engines": ["compute"]}


def test_off_by_default_and_on_for_the_kind_this_node_serves(metax_node: Any, fakes: Any) -> None:
    node = metax_node(fakes.c500_server(2))
    off = node.plugins()
    off.discover()
    assert off.drm_usage_source("Metax-SGPU") is None
    plugins = node.plugins(drmFdinfo=ON)
    plugins.discover()
    source = plugins.drm_usage_source("Metax-SGPU")
    assert source is not None
    assert (source.drivers, source.engines, source.memory_regions) == (("metax",), ("compute",), ())
    assert dict(source.devices) == {g.bdf: g.uuid for g in node.gpus}
    assert plugins.drm_usage_source("Metax-GPU") is None  # a node serves one kind
