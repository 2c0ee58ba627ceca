"""The AMD plugin: the conformance kit, HAMi's AMD requests, and its fit in compute units.

The fitting cases are those of HAMi v2.10's ``pkg/device/amd/device_test.go`` (``TestDevices_Fit``): a GPU's
``devcore`` is its compute units, a grant's cores are ``floor(percent × CUs / 100)`` of them (at least one, at most
all), a request without memory takes the whole GPU's memory.
"""

from __future__ import annotations

import atexit
import shutil
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

from hami.errors import RequestError
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
from hami_vendor_amd import plugin

COUNT, MEMORY, CORES = "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores"
MI300X = "AMD Instinct MI300X"


def req(count: int = 1, memory: int = 0, cores: int = 100) -> ContainerRequest:
    percent = None if memory else 100
    return ContainerRequest(kind="AMD", count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    RequestCase("AMD", {COUNT: "1"}, req()),
    RequestCase("AMD", {COUNT: "1", MEMORY: "16384", CORES: "25"}, req(memory=16384, cores=25)),
    RequestCase("AMD", {COUNT: "1", MEMORY: "1000"}, req(memory=1000)),  # no cores: every CU of the GPU
    RequestCase("AMD", {COUNT: "2", MEMORY: "0", CORES: "50"}, req(count=2, cores=50)),  # memory 0: the whole GPU's
    RequestCase("AMD", {COUNT: "0", MEMORY: "1000"}, None),
    RequestCase("AMD", {MEMORY: "1000", CORES: "30"}, None),  # HAMi asks for GPUs only with amd.com/gpu
    RequestCase("AMD", {COUNT: "1", CORES: "0"}, "integer percentage between 1 and 100"),
    RequestCase("AMD", {COUNT: "1", CORES: "101"}, "integer percentage between 1 and 100"),
    RequestCase("AMD", {COUNT: "1", CORES: "12.5"}, "plain non-negative integer"),
    RequestCase("AMD", {COUNT: "1", MEMORY: "4Gi"}, "write 4096"),
    RequestCase("AMD", {COUNT: "1", MEMORY: "3000000000"}, "largest legal value"),
]


def gpu(node: str, i: int, used: int = 0, usedmem: int = 0, usedcores: int = 0, **device: object) -> DeviceUsage:
    fields: dict[str, object] = {"id": f"{node}-gpu{i}", "index": i + 1, "count": 10, "devmem": 196608,
                                 "devcore": 304, "type": MI300X}  # fmt: skip
    return DeviceUsage(device=Device(**{**fields, **device}), used=used, usedmem=usedmem, usedcores=usedcores)


def mi300x_nodes() -> list[NodeView]:
    """An idle node of two MI300X and a busy one."""
    return [
        NodeView(name="idle", devices=[gpu("idle", i) for i in range(2)]),
        NodeView(name="busy", devices=[gpu("busy", 0, 3, 150000, 228), gpu("busy", 1, 1, 196608, 304)]),
    ]


_NODE: list[Path] = []


def conformance_node() -> tuple[Path, list[str]]:
    """A fake AMD node of two MI300X (fake AMD SMI, sysfs), for the container-edit checks (built once)."""
    fake = _fake()
    if not _NODE:
        directory = Path(tempfile.mkdtemp(prefix="hami-amd-conformance-"))
        atexit.register(shutil.rmtree, directory, True)
        fake.write_machine(directory, fake.build_fake_amdsmi(directory / "build"), [fake.gpu(0), fake.gpu(1)])
        _NODE.append(directory)
    return _NODE[0], [fake.gpu(0).uuid, fake.gpu(1).uuid]


def _fake() -> ModuleType:
    """``fake_amdsmi/machine.py``, which conftest.py loaded (by path: a conftest cannot be imported)."""
    return sys.modules["hami_amd_test_machine"]


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type=MI300X, usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))


def make_fixture() -> VendorFixture:
    node, (a, b) = conformance_node()
    config = {"amdSmiLibrary": str(node / "libamd_smi.so"), "sysfsRoot": str(node / "sys"),
              "hookPath": str(node / "hook")}  # fmt: skip
    edits = [EditCase("AMD", placed((a, 16384, 76)), pod=EDIT_POD),
             EditCase("AMD", placed((a, 16384, 76), (b, 196608, 304)), 1, pod=EDIT_POD)]  # fmt: skip
    plugins = VendorPlugins.from_plugins({"amd": plugin}, config={"amd": config})
    for case in edits:  # the CU masks are chosen at Allocate, which the node daemon calls before the edits
        plugins.allocate("AMD", case.pod, case.container_index, case.placement)
    return VendorFixture(
        name="amd",
        plugin=plugin,
        config=config,
        requests=REQUESTS,
        nodes={"AMD": mi300x_nodes},
        fit_requests={"AMD": [req(memory=16384, cores=25), req(), req(count=2), req(memory=190000, cores=10)]},
        edits=edits,
    )


test_conformance = pytest_suite(make_fixture)


def plugins() -> VendorPlugins:
    return VendorPlugins.from_plugins({"amd": plugin}, config={"amd": {}})


def fit_one(request: ContainerRequest, devices: list[DeviceUsage], **annotations: str) -> tuple[ContainerDevice, ...]:
    pod = Pod(name="p", annotations=annotations, containers=(Container(name="c"),))
    (fit,) = plugins().fit_nodes("AMD", pod, [request], [NodeView(name="n", devices=devices)], SchedulingPolicy())
    assert fit.placement is not None, fit.reason
    return fit.placement[0]


def refusal(request: ContainerRequest, devices: list[DeviceUsage], **annotations: str) -> str:
    pod = Pod(name="p", annotations=annotations, containers=(Container(name="c"),))
    (fit,) = plugins().fit_nodes("AMD", pod, [request], [NodeView(name="n", devices=devices)], SchedulingPolicy())
    assert fit.placement is None
    return fit.reason


def test_hamis_names_and_json_register():
    kind = plugin.KIND
    assert kind.register_format is RegisterFormat.JSON
    assert kind.resources.all() == (COUNT, MEMORY, CORES)
    keys = kind.annotations
    assert (keys.node_register, keys.node_handshake) == ("hami.io/node-amd-register", None)
    assert (keys.to_allocate, keys.allocated) == ("hami.io/amd-devices-to-allocate", "hami.io/amd-devices-allocated")
    assert keys.selectors() == ("amd.com/use-gpu-uuid", "amd.com/nouse-gpu-uuid", "amd.com/use-gputype",
                                "amd.com/nouse-gputype")  # fmt: skip


def test_whole_gpus_take_all_their_memory_and_compute_units():
    devices = [gpu("n", i, devmem=1000, devcore=100) for i in range(2)]
    got = fit_one(req(count=2), devices)
    assert [(d.usedmem, d.usedcores) for d in got] == [(1000, 100), (1000, 100)]


@pytest.mark.parametrize(
    ("percent", "units", "granted"),
    [(50, 100, 50), (50, 10, 5), (25, 304, 76), (33, 304, 100), (67, 304, 203), (1, 64, 1), (100, 64, 64)],
)
def test_a_core_percentage_is_granted_as_that_share_of_the_gpus_compute_units(percent, units, granted):
    (got,) = fit_one(req(memory=500, cores=percent), [gpu("n", 0, devmem=1000, devcore=units)])
    assert (got.usedmem, got.usedcores) == (500, granted)


def test_the_placed_type_is_the_gpus_model_as_hami_writes_it():
    (got,) = fit_one(req(memory=100, cores=10), [gpu("n", 0, type="AMD Instinct MI300X VF")])
    assert got.type == "AMD Instinct MI300X VF"


def test_compute_units_are_a_resource_a_gpu_runs_out_of():
    # HAMi's case: 10 CUs, 9 used; a request of 100 % (all 10) does not fit, one of 10 % (1 CU) does
    busy = [gpu("n", 0, used=1, usedmem=0, usedcores=9, devmem=1000, devcore=10)]
    assert "insufficient cores" in refusal(req(memory=100, cores=100), busy) or "not idle" in refusal(
        req(memory=100, cores=100), busy
    )
    (got,) = fit_one(req(memory=100, cores=10), busy)
    assert got.usedcores == 1
    assert "insufficient memory" in refusal(req(memory=500, cores=10), [gpu("n", 0, usedmem=196200, used=1)])
    assert "unhealthy" in refusal(req(memory=100, cores=10), [gpu("n", 0, health=False)])


def test_a_memory_only_request_takes_every_compute_unit_so_the_gpu_is_not_shared_further():
    first = fit_one(req(memory=1000), [gpu("n", 0)])
    assert [(d.usedmem, d.usedcores) for d in first] == [(1000, 304)]
    assert refusal(req(memory=1000, cores=10), [gpu("n", 0, used=1, usedmem=1000, usedcores=304)])


@pytest.mark.parametrize(
    ("annotations", "fits"),
    [
        ({"amd.com/use-gputype": "mi300"}, True),  # a case-insensitive substring of the model, as checkAMDType
        ({"amd.com/use-gputype": "MI250, MI300X"}, True),
        ({"amd.com/use-gputype": "MI250"}, False),
        ({"amd.com/nouse-gputype": "Instinct"}, False),
        ({"amd.com/use-gpu-uuid": "n-gpu0"}, True),
        ({"amd.com/nouse-gpu-uuid": "n-gpu0"}, False),
    ],
)
def test_hamis_selectors(annotations, fits):
    pod = Pod(name="p", annotations=annotations, containers=(Container(name="c"),))
    (fit,) = plugins().fit_nodes("AMD", pod, [req(memory=100, cores=10)], [NodeView(name="n", devices=[gpu("n", 0)])],
                              SchedulingPolicy())  # fmt: skip
    assert (fit.placement is not None) is fits, fit.reason


def test_a_mutex_pod_takes_only_an_idle_gpu():
    devices = [gpu("n", 0, used=1, usedmem=100, usedcores=10), gpu("n", 1)]
    pod = Pod(name="p", annotations={"hami.io/gpu-scheduler-policy": "mutex"}, containers=(Container(name="c"),))
    policy = SchedulingPolicy(device=("mutex",))
    (fit,) = plugins().fit_nodes("AMD", pod, [req(memory=100, cores=10)], [NodeView(name="n", devices=devices)], policy)
    assert fit.placement is not None
    assert [d.uuid for d in fit.placement[0]] == ["n-gpu1"]


def test_bad_settings_are_refused_by_name():
    from hami.errors import ConfigError

    with pytest.raises(ConfigError, match="coreSplit"):
        VendorPlugins.from_plugins({"amd": plugin}, config={"amd": {"coreSplit": "half"}}).container_request(
            "AMD", Container(name="c", limits={COUNT: "1"}), Pod(name="p")
        )


def test_a_cores_refusal_names_the_resource():
    container = Container(name="c", limits={COUNT: "1", CORES: "150"})
    with pytest.raises(RequestError) as err:
        plugins().container_request("AMD", container, Pod(name="p", containers=(container,)))
    assert err.value.resource == CORES
