"""The Hygon plugin: the conformance kit and HAMi's shared request rules for DCUs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami.errors import ConfigError, RequestError
from hami.model import Container, ContainerRequest, Pod, RegisterFormat
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_hygon import plugin

COUNT, MEMORY, CORES = "hygon.com/dcunum", "hygon.com/dcumem", "hygon.com/dcucores"


def req(count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind="DCU", count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    RequestCase("DCU", {COUNT: "1"}, req(percent=100, cores=100)),
    RequestCase("DCU", {COUNT: "2", MEMORY: "4000", CORES: "30"}, req(2, memory=4000, cores=30)),
    RequestCase("DCU", {COUNT: "1", MEMORY: "4000"}, req(memory=4000)),
    RequestCase("DCU", {MEMORY: "2000"}, req(memory=2000)),
    RequestCase("DCU", {CORES: "40"}, req(percent=100, cores=40)),
    RequestCase("DCU", {COUNT: "0"}, None),
    RequestCase("DCU", {COUNT: "1", MEMORY: "4Gi"}, "write 4096"),
    RequestCase("DCU", {COUNT: "1", CORES: "101"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    RequestCase("DCU", {COUNT: "-1"}, "plain non-negative integer"),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="hygon", plugin=plugin, requests=REQUESTS)


test_conformance = pytest_suite(make_fixture)


def host(config: Mapping[str, Any] | None = None) -> VendorHost:
    return VendorHost.from_plugins({"hygon": plugin}, config={"hygon": dict(config or {})})


def test_metadata_is_hami_wiring() -> None:
    (kind,) = plugin.INFO.kinds
    assert kind.common_word == "DCU"
    assert kind.register_format is RegisterFormat.LEGACY
    keys = kind.annotations
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-dcu-register", "hami.io/node-handshake-dcu")
    assert (keys.to_allocate, keys.allocated) == ("hami.io/dcu-devices-to-allocate", "hami.io/dcu-devices-allocated")
    assert keys.selectors() == (
        "hygon.com/use-gpuuuid",
        "hygon.com/nouse-gpuuuid",
        "hygon.com/use-dcutype",
        "hygon.com/nouse-dcutype",
    )


def test_count_under_requests_is_read() -> None:
    container = Container(name="main", requests={COUNT: "1"})
    assert host().container_request("DCU", container, Pod(name="p", containers=(container,))) == req(
        percent=100, cores=100
    )


def test_defaults_are_configurable() -> None:
    h = host({"defaultMem": 8192, "defaultCores": 20})
    container = Container(name="main", limits={COUNT: "1"})
    assert h.container_request("DCU", container, Pod(name="p", containers=(container,))) == req(memory=8192, cores=20)


def test_refusal_names_resource() -> None:
    container = Container(name="main", limits={COUNT: "1", CORES: "half"})
    with pytest.raises(RequestError) as err:
        host().container_request("DCU", container, Pod(name="p", containers=(container,)))
    assert err.value.resource == CORES


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="hygon"):
        host({"defaultCores": 200})
