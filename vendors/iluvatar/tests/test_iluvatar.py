"""The Iluvatar plugin: the conformance kit, per-chip names, and multi-GPU requests read as whole GPUs."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hami.codec import encode_link_scores
from hami.errors import ConfigError, RequestError
from hami.model import (
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    RegisterFormat,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, pytest_suite
from hami.testing.sandbox import CSRC, find_compiler
from hami_vendor_iluvatar import plugin

V150 = "BI-V150"
COUNT, MEMORY, CORES = "iluvatar.ai/BI-V150-vgpu", "iluvatar.ai/BI-V150.vMem", "iluvatar.ai/BI-V150.vCore"


def req(
    count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0, kind: str = V150
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int, kind: str = V150) -> ContainerRequest:
    return req(count, percent=100, cores=100, kind=kind)


REQUESTS = [
    RequestCase(V150, {COUNT: "1"}, whole(1)),
    RequestCase(V150, {COUNT: "1", MEMORY: "16", CORES: "50"}, req(memory=4096, cores=50)),  # 16 × 256 MiB
    RequestCase(V150, {MEMORY: "8"}, req(memory=2048)),
    RequestCase(V150, {CORES: "30"}, req(percent=100, cores=30)),
    RequestCase(V150, {COUNT: "0"}, None),
    # several GPUs are whole GPUs, whatever vMem and vCore say
    RequestCase(V150, {COUNT: "2"}, whole(2)),
    RequestCase(V150, {COUNT: "2", MEMORY: "16", CORES: "50"}, whole(2)),
    RequestCase(V150, {COUNT: "3", CORES: "300"}, whole(3)),  # what HAMi's webhook writes
    RequestCase(V150, {COUNT: "2", MEMORY: "4Gi"}, "counts 256 MiB"),
    RequestCase(V150, {COUNT: "2", CORES: "all"}, "plain non-negative integer"),
    RequestCase(V150, {COUNT: "1", CORES: "200"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    RequestCase(V150, {COUNT: "1", MEMORY: "4Gi"}, "counts 256 MiB"),
    RequestCase(
        "MR-V50", {"iluvatar.ai/MR-V50-vgpu": "1", "iluvatar.ai/MR-V50.vMem": "4"}, req(memory=1024, kind="MR-V50")
    ),
]


def gpu(node: str, i: int, used: int = 0, usedmem: int = 0, usedcores: int = 0, chip: str = V150) -> DeviceUsage:
    device = Device(id=f"GPU-{node}-{i}", index=i, count=10, devmem=32768, devcore=100, type=chip)
    return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=usedcores)


def v150_nodes() -> list[NodeView]:
    """An idle BI-V150 board (two chips) and a busy one."""
    return [
        NodeView(name="idle", devices=[gpu("idle", i) for i in range(2)]),
        NodeView(name="busy", devices=[gpu("busy", 0, 3, 24576, 90), gpu("busy", 1, 1, 32768, 100)]),
    ]


_FAKE_NODE: list[Path] = []
CONFORMANCE_UUIDS = [f"GPU-c0ffee00-0000-4000-8000-00000000000{i}" for i in range(2)]


def conformance_node() -> Path:
    """The fake ixML with a two-chip BI-V150 board beside it, for the container-edit checks (built once)."""
    if not _FAKE_NODE:
        directory = Path(tempfile.mkdtemp(prefix="hami-iluvatar-conformance-"))
        atexit.register(shutil.rmtree, directory, True)
        source = Path(__file__).parent / "fake_ixml" / "fake_ixml.c"
        argv = [find_compiler(), "-std=c11", "-O1", "-fPIC", "-shared", f"-I{CSRC}", "-fvisibility=hidden", "-o",
                str(directory / "libixml.so"), str(source)]  # fmt: skip
        subprocess.run(argv, check=True, capture_output=True, timeout=120)
        lines = [
            f"{u} {i} 32768 00000000:{0x8A + i:02X}:00.0 0 ok Iluvatar BI-V150S\n"
            for i, u in enumerate(CONFORMANCE_UUIDS)
        ]
        (directory / "fake_ixml.machine").write_text("".join(lines))
        _FAKE_NODE.append(directory)
    return _FAKE_NODE[0]


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type=V150, usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))


def make_fixture() -> VendorFixture:
    node = conformance_node()
    a, b = CONFORMANCE_UUIDS
    return VendorFixture(
        name="iluvatar",
        plugin=plugin,
        config={"ixmlLibrary": str(node / "libixml.so"), "hookPath": str(node / "hook")},
        requests=REQUESTS,
        nodes={V150: v150_nodes},
        fit_requests={V150: [req(memory=4096, cores=25), whole(1), whole(2), req(memory=30000)]},
        edits=[
            EditCase(V150, placed((a, 32768, 100)), pod=EDIT_POD),
            EditCase(V150, placed((a, 8192, 30), (b, 32768, 100)), 1, pod=EDIT_POD),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def read(kind: str, resources: Mapping[str, str], config: Mapping[str, Any] | None = None) -> ContainerRequest | None:
    plugins = VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return plugins.container_request(kind, container, Pod(name="p", containers=(container,)))


@pytest.mark.parametrize("chip", ["MR-V100", "MR-V50", "BI-V150", "BI-V100"])
def test_one_kind_per_chip_with_hami_names(chip: str) -> None:
    kind = plugin.INFO.kind(chip)
    assert kind.register_format is RegisterFormat.LEGACY
    assert kind.resources.all() == (f"iluvatar.ai/{chip}-vgpu", f"iluvatar.ai/{chip}.vMem", f"iluvatar.ai/{chip}.vCore")
    assert kind.resources.memory_unit_mib == 256
    keys = kind.annotations
    assert (keys.node_register, keys.node_handshake) == (
        f"hami.io/node-{chip}-register",
        f"hami.io/node-handshake-{chip}",
    )
    assert (keys.to_allocate, keys.allocated) == (
        f"hami.io/{chip}-devices-to-allocate",
        f"hami.io/{chip}-devices-allocated",
    )
    assert keys.selectors() == (f"hami.io/use-{chip}-uuid", f"hami.io/no-use-{chip}-uuid")


def test_chips_do_not_read_each_others_resources() -> None:
    assert read("BI-V100", {COUNT: "1"}) is None


def test_default_memory_applies_to_single_gpus_only() -> None:
    config = {"defaultMem": 4096, "defaultCores": 25}
    assert read(V150, {COUNT: "1"}, config) == req(memory=4096, cores=25)
    assert read(V150, {COUNT: "2"}, config) == whole(2)


def test_multi_gpu_refusal_names_resource() -> None:
    with pytest.raises(RequestError) as err:
        read(V150, {COUNT: "2", CORES: "1.5"})
    assert err.value.resource == CORES


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="iluvatar"):
        read(V150, {COUNT: "1"}, {"defaultMemory": 1})


def test_uuid_selectors_are_hamis():
    plugins = VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": {}})
    for selectors, fitting in (
        ({"hami.io/use-BI-V150-uuid": "GPU-busy-0"}, ["busy"]),
        ({"hami.io/no-use-BI-V150-uuid": "GPU-idle-0,GPU-idle-1"}, ["busy"]),
        ({}, ["idle", "busy"]),
    ):
        pod = Pod(name="p", annotations=selectors, containers=(Container(name="c"),))
        fits = plugins.fit_nodes(V150, pod, [req(memory=1024, cores=10)], v150_nodes(), SchedulingPolicy())
        assert [f.node for f in fits if f.placement] == fitting, selectors


def test_an_exclusive_request_never_shares_a_chip():
    plugins = VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": {}})
    pod = Pod(name="p", containers=(Container(name="c"),))
    fits = plugins.fit_nodes(V150, pod, [whole(1)], v150_nodes(), SchedulingPolicy())
    assert [f.node for f in fits if f.placement] == ["idle"]


def test_the_topology_policy_keeps_a_boards_chips_together():
    """Two BI-V150 boards (chips 0 and 2 on one, 1 and 3 on the other), chip 2 busy: binpack alone takes chip 2 and
    then (HAMi's order on equal scores) chip 3, across boards; with the topology-aware device policy the pair is on
    one board, by the node's hami.io/node-iluvatar-score."""
    plugins = VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": {}})
    devices = [gpu("n", 0), gpu("n", 1), gpu("n", 2, 1, 1024, 10), gpu("n", 3)]
    links = {"GPU-n-0": {"GPU-n-2": 100}, "GPU-n-2": {"GPU-n-0": 100}, "GPU-n-1": {"GPU-n-3": 100},
             "GPU-n-3": {"GPU-n-1": 100}}  # fmt: skip
    node = NodeView(name="n", devices=devices, annotations={"hami.io/node-iluvatar-score": encode_link_scores(links)})
    pod = Pod(name="p", containers=(Container(name="c"),))
    two = ContainerRequest(kind=V150, count=2, memory=1024, cores=10)
    chosen = {}
    for device_policy in (("binpack",), ("binpack", "topology-aware")):
        (fit,) = plugins.fit_nodes(V150, pod, [two], [node], SchedulingPolicy(device=device_policy))
        assert fit.placement is not None
        chosen[device_policy[-1]] = sorted(d.uuid for d in fit.placement[0])
    assert chosen == {"binpack": ["GPU-n-2", "GPU-n-3"], "topology-aware": ["GPU-n-0", "GPU-n-2"]}
