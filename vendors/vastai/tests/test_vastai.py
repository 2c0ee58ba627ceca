"""The Vastai plugin: the conformance kit, HAMi's requests, its node devices, and its fit of cards and dies.

Cases from HAMi v2.10's ``pkg/device/vastai/device_test.go`` (GenerateResourceRequests, GetNodeDevices, Fit in card
and die mode, computeBestCombination, ScoreNode).
"""

from __future__ import annotations

from typing import Any

import pytest

from hami.codec import encode_node_register
from hami.model import (
    Container,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_vastai import plugin

VA = "vastaitech.com/va"


def req(count: int = 1) -> ContainerRequest:
    return ContainerRequest(kind="Vastai", count=count)


REQUESTS = [
    RequestCase("Vastai", {VA: "1"}, req()),
    RequestCase("Vastai", {VA: "3"}, req(3)),
    RequestCase("Vastai", {VA: "0"}, None),
    RequestCase("Vastai", {VA: "1.5"}, "plain non-negative integer"),
]


def card(node: str, i: int, used: int = 0, **custom: Any) -> DeviceUsage:
    device = Device(id=f"{node}-va-{i}", index=i, count=4, devmem=16384, devcore=100, type="Vastai", custom=custom)
    return DeviceUsage(device=device, used=used)


def die(node: str, i: int, aic: str, used: int = 0) -> DeviceUsage:
    return card(node, i, used, DeviceStrategy="die", AIC=aic)


def nodes() -> list[NodeView]:
    """A node of two cards, one of them full; and a node of dies on two cards (0-2 on card a, 3 on card b)."""
    cards = NodeView(name="cards", devices=[card("cards", 0, used=4), card("cards", 1, used=1)])
    dies = NodeView(name="dies", devices=[die("dies", 0, "a"), die("dies", 1, "a"), die("dies", 2, "a"),
                                          die("dies", 3, "b", used=1)])  # fmt: skip
    return [cards, dies]


def make_fixture() -> VendorFixture:
    fit_requests = {"Vastai": [req(), req(2)]}
    return VendorFixture(
        name="vastai", plugin=plugin, requests=REQUESTS, nodes={"Vastai": nodes}, fit_requests=fit_requests
    )


test_conformance = pytest_suite(make_fixture)


def plugins() -> VendorPlugins:
    return VendorPlugins.from_plugins({"vastai": plugin}, config={"vastai": {}})


def fit(count: int, devices: list[DeviceUsage], policy: tuple[str, ...] = ("spread",)) -> list[str] | None:
    pod = Pod(name="p", containers=(Container(name="c"),))
    (got,) = plugins().fit_nodes("Vastai", pod, [req(count)], [NodeView(name="n", devices=devices)],
                              SchedulingPolicy(device=policy))  # fmt: skip
    return None if got.placement is None else [d.uuid for d in got.placement[0]]


def test_hamis_names():
    keys = plugin.KIND.annotations
    assert plugin.KIND.register_format is RegisterFormat.JSON
    assert plugin.KIND.resources.all() == (VA,)
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-va-register", "hami.io/node-handshake-va")
    assert (keys.to_allocate, keys.allocated) == (
        "hami.io/Vastai-devices-to-allocate",
        "hami.io/Vastai-devices-allocated",
    )
    assert keys.selectors() == ("vastaitech.com/use-gpuuuid", "vastaitech.com/nouse-gpuuuid")


def test_node_devices_are_the_register_with_cores_read_as_100():
    registered = [Device(id="va-0", index=0, count=4, devmem=16384, devcore=0, type="Vastai", custom={"AIC": "0"})]
    found = plugins().node_devices("Vastai", {"hami.io/node-va-register": encode_node_register(registered)})
    assert found is not None
    assert [(d.id, d.devcore, d.vendor, dict(d.custom)) for d in found] == [("va-0", 100, "Vastai", {"AIC": "0"})]
    assert plugins().node_devices("Vastai", {"hami.io/node-va-register": "not json"}) == []
    assert plugins().node_devices("Vastai", {}) == []


def test_a_card_is_shared_up_to_its_count_and_a_placement_asks_no_memory_or_cores():
    pod = Pod(name="p", containers=(Container(name="c"),))
    (got,) = plugins().fit_nodes("Vastai", pod, [req()], [NodeView(name="n", devices=[card("n", 0, used=3)])],
                              SchedulingPolicy())  # fmt: skip
    assert got.placement is not None
    assert [(d.uuid, d.type, d.usedmem, d.usedcores) for d in got.placement[0]] == [("n-va-0", "Vastai", 0, 0)]
    assert fit(1, [card("n", 0, used=4)]) is None


def test_several_dies_come_from_the_card_with_most_free():
    # walked from the end of HAMi's list: 3 (card b), 2, 1, 0 (card a): card a has three, so two of its dies
    devices = [die("n", 0, "a"), die("n", 1, "a"), die("n", 2, "a"), die("n", 3, "b")]
    assert fit(2, devices) == ["n-va-2", "n-va-1"]
    assert fit(1, devices) == ["n-va-3"]
    assert fit(4, devices) == ["n-va-3", "n-va-2", "n-va-1", "n-va-0"]
    assert fit(5, devices) is None


def test_under_mutex_no_die_of_a_card_another_pod_uses():
    devices = [die("n", 0, "a", used=1), die("n", 1, "a"), die("n", 2, "b"), die("n", 3, "b")]
    assert fit(2, devices, ("mutex",)) == ["n-va-3", "n-va-2"]
    assert fit(3, devices, ("mutex",)) is None
    assert fit(3, devices) is not None  # without mutex the busy card's idle die may be taken


@pytest.mark.parametrize(
    ("uuids", "bonus"), [(["n-va-0", "n-va-1"], 1.0), (["n-va-1", "n-va-2"], 0.5), (["n-va-0"], 1.0)]
)
def test_the_score_adds_each_containers_share_of_dies_on_one_card(uuids, bonus):
    from hami.model import ContainerDevice, NodeFit

    devices = [die("n", 0, "a"), die("n", 1, "a"), die("n", 2, "b")]
    placement = (tuple(ContainerDevice(uuid=u, type="Vastai") for u in uuids),)
    fits = [NodeFit(node="n", placement=placement, score=7.0)]
    pod = Pod(name="p", containers=(Container(name="c"),))
    scores = plugins().score_nodes("Vastai", pod, fits, {"n": NodeView(name="n", devices=devices)}, SchedulingPolicy())
    assert scores == {"n": 7.0 + bonus}


def test_cards_get_no_score_bonus():
    from hami.model import ContainerDevice, NodeFit

    placement = ((ContainerDevice(uuid="n-va-0", type="Vastai"),),)
    fits = [NodeFit(node="n", placement=placement, score=3.0)]
    view = NodeView(name="n", devices=[card("n", 0, DeviceStrategy="card", AIC="a")])
    pod = Pod(name="p", containers=(Container(name="c"),))
    assert plugins().score_nodes("Vastai", pod, fits, {"n": view}, SchedulingPolicy()) == {"n": 3.0}
