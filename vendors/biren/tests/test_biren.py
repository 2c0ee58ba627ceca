"""The Biren plugin: the conformance kit, HAMi's names, BRML discovery over the fake library, the register as
HAMi reads it, whole-card fits, and the container edits of Biren's device plugin."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import hami_vendor_biren.plugin as plugin
from hami.codec import encode_node_register
from hami.errors import HamiError
from hami.model import (
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeInventory,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite

W, GPU = "Biren", "birentech.com/gpu"
CARDS = (("BR-0a1b", "BR104", 32768, 4), ("BR-0a1c", "BR104", 32768, 5))

REQUESTS = [
    RequestCase(W, {GPU: "2"}, ContainerRequest(kind=W, count=2)),
    RequestCase(W, {GPU: "0"}, None),
    RequestCase(W, {GPU: "one"}, "plain non-negative integer"),
]


def card(node: str, i: int, used: int = 0) -> DeviceUsage:
    return DeviceUsage(device=Device(id=f"{node}-card_{i}", index=i, count=1, devmem=32768, devcore=100, type="BR104"),
                       used=used)  # fmt: skip


def nodes() -> list[NodeView]:
    return [NodeView(name="idle", devices=[card("idle", i) for i in range(2)]),
            NodeView(name="busy", devices=[card("busy", 0, 1), card("busy", 1)])]  # fmt: skip


def placed(*ids: str) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=i, type=W) for i in ids)


def make_fixture() -> VendorFixture:
    """The kit's material; container edits run over the fake BRML (built by conftest) with two cards."""
    machine = Path(tempfile.gettempdir()) / f"hami-biren-conformance-{os.getpid()}.machine"
    machine.write_text("".join(f"{u} {n} {m} {i}\n" for u, n, m, i in CARDS))
    os.environ["FAKE_BRML_CONFIG"] = str(machine)
    return VendorFixture(
        name="biren",
        plugin=plugin,
        config={"brmlLibrary": os.environ["HAMI_TEST_FAKE_BRML"]},
        requests=REQUESTS,
        nodes={W: nodes},
        fit_requests={W: [ContainerRequest(kind=W, count=1), ContainerRequest(kind=W, count=2)]},
        edits=[EditCase(W, placed("card_4")), EditCase(W, placed("card_5", "card_4"))],
    )


test_conformance = pytest_suite(make_fixture)


def plugins(config: dict[str, object] | None = None) -> VendorPlugins:
    return VendorPlugins.from_plugins({"biren": plugin}, config={"biren": config or {}}, strict=True)


def test_the_kind_carries_hamis_names() -> None:
    keys = plugin.BIREN.annotations
    assert plugin.BIREN.register_format is RegisterFormat.JSON
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-biren-register", "hami.io/node-handshake-biren")
    assert (keys.to_allocate, keys.allocated) == (
        "hami.io/Biren-devices-to-allocate",
        "hami.io/Biren-devices-allocated",
    )
    assert keys.selectors() == ("birentech.com/use-gpuuuid", "birentech.com/nouse-gpuuuid")


def test_brml_cards_are_registered_as_birens_plugin_registers_them(
    fake_brml: Path, machine: Callable[..., Path]
) -> None:
    machine(*CARDS)
    (inventory,) = plugins({"brmlLibrary": str(fake_brml)}).discover()["biren"]
    assert inventory == NodeInventory(kind=W, devices=(
        Device(id="card_4", index=0, count=1, devmem=32768, devcore=100, type="BR104", vendor=W),
        Device(id="card_5", index=1, count=1, devmem=32768, devcore=100, type="BR104", vendor=W)))  # fmt: skip


def test_a_card_brml_cannot_name_is_left_out_and_without_brml_the_node_says_so(
    fake_brml: Path, machine: Callable[..., Path], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine(("-", "BR104", 32768, 3), CARDS[0])
    (inventory,) = plugins({"brmlLibrary": str(fake_brml)}).discover()["biren"]
    assert [d.id for d in inventory.devices] == ["card_4"]
    assert "Biren card 0 is not reported: BRML brmlDeviceGetUUID failed with status 255: Unknown Error" in caplog.text
    monkeypatch.delenv("FAKE_BRML_CONFIG")
    assert plugins({"brmlLibrary": str(fake_brml)}).discover()["biren"] == []
    assert "BRML brmlInit failed with status 7: Driver Not Loaded: this node reports no Biren card" in caplog.text


def test_the_scheduler_gives_every_registered_card_100_cores_as_hami_does() -> None:
    # HAMi's own test register, from Biren's plugin: no cores in it
    raw = '[{"id":"7-0","count":1,"devmem":32768,"type":"Biren","health":true,"devicepairscore":{}}]'
    (device,) = plugins().node_devices(W, {"hami.io/node-biren-register": raw}, "n") or []
    assert (device.id, device.count, device.devmem, device.devcore, device.vendor) == ("7-0", 1, 32768, 100, W)
    assert plugins().node_devices(W, {"hami.io/node-biren-register": ":"}, "n") == []
    assert plugins().node_devices(W, {}, "n") is None  # this daemon publishes the register itself


def test_a_card_serves_one_container_and_the_grant_counts_nothing() -> None:
    register = encode_node_register([card("n", i).device for i in range(2)])
    devices = plugins().node_devices(W, {"hami.io/node-biren-register": register}, "n") or []
    view = NodeView(name="n", devices=[DeviceUsage(device=d) for d in devices])
    pod = Pod(name="p", annotations={"birentech.com/nouse-gpuuuid": "n-card_1"})
    (fit,) = plugins().fit_nodes(W, pod, [ContainerRequest(kind=W, count=1)], [view], SchedulingPolicy())
    assert fit.placement == ((ContainerDevice(uuid="n-card_0", type=W, usedmem=0, usedcores=0),),)
    view.devices[0].used = 1
    (fit,) = plugins().fit_nodes(W, pod, [ContainerRequest(kind=W, count=1)], [view], SchedulingPolicy())
    assert fit.placement is None


def test_container_edits_are_birens_device_nodes_and_cards(fake_brml: Path, machine: Callable[..., Path]) -> None:
    machine(*CARDS)
    pod = Pod(name="p", uid="u")
    h = plugins({"brmlLibrary": str(fake_brml), "mountDriDevice": True})
    edits = h.container_edits(W, pod, 0, placed("card_5", "card_4"))
    assert dict(edits.env) == {"BR_PHY_CARDS": "card_5,card_4"}
    assert [(d.container_path, d.host_path) for d in edits.devices] == [
        ("/dev/biren/card_5", "/dev/biren/card_5"), ("/dev/biren/card_4", "/dev/biren/card_4"),
        ("/dev/dri/renderD128", "/dev/dri/renderD128")]  # fmt: skip
    cdi = plugins({"brmlLibrary": str(fake_brml), "cdi": True}).container_edits(W, pod, 0, placed("card_4"))
    assert (cdi.cdi_devices, cdi.devices) == (("birentech.com/gpu=card_4",), ())
    with pytest.raises(HamiError, match="Biren card card_9 is not on this node"):
        h.container_edits(W, pod, 0, placed("card_9"))
