"""The Ascend plugin: the conformance kit with material for every check, the request rules (soft split, whole cards,
super-pod modules), admission defaults, and the chip settings."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

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
)
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, applicable, pytest_suite
from hami_vendor_ascend import plugin
from hami_vendor_ascend.plugin import AscendSettings

B3 = "Ascend910B3"
C = "Ascend910C"
SOFT = {"huawei.com/vnpu-mode": "hami-core"}


def req(
    kind: str = B3, count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int, kind: str = B3) -> ContainerRequest:
    return req(kind, count, percent=100, cores=100)


def res(kind: str = B3, count: str | None = None, memory: str | None = None, core: str | None = None) -> dict[str, str]:
    resources = {f"huawei.com/{kind}": count, f"huawei.com/{kind}-memory": memory, f"huawei.com/{kind}-core": core}
    return {k: v for k, v in resources.items() if v is not None}


def b3(count: str | None = None, memory: str | None = None, core: str | None = None) -> dict[str, str]:
    return res(B3, count, memory, core)


REQUESTS = [
    # whole cards and shares in template mode (the memory is kept as written; the fit rounds it to a template)
    RequestCase(B3, b3("1"), whole(1)),
    RequestCase(B3, b3("4"), whole(4)),
    RequestCase(B3, b3("1", memory="16384"), req(memory=16384)),
    RequestCase(B3, b3(memory="8000"), req(memory=8000)),
    RequestCase(B3, b3("0"), None),
    RequestCase(B3, b3("1", memory="16Gi"), "write 16384"),
    RequestCase(B3, b3("1", memory="70000"), "more than one Ascend910B3 holds (65536 MiB)"),
    # -core only in soft-split mode
    RequestCase(B3, b3("1", memory="16384", core="40"), "huawei.com/vnpu-mode: hami-core"),
    RequestCase(B3, b3("1", core="40"), "add the pod annotation", {"huawei.com/vnpu-mode": "template"}),
    RequestCase(B3, b3("1", memory="28672", core="40"), req(memory=28672, cores=40), SOFT),
    RequestCase(B3, b3(core="25"), req(percent=100, cores=25), SOFT),
    RequestCase(B3, b3("1", core="101"), req(percent=100, cores=100), SOFT),  # HAMi clamps cores at 100
    RequestCase(B3, b3("1"), "is not a vNPU mode", {"huawei.com/vnpu-mode": "hamicore"}),
    # several devices are whole cards only
    RequestCase(B3, b3("2", memory="16384"), "whole cards only"),
    RequestCase(B3, b3("2", core="40"), "whole cards only", SOFT),
    RequestCase(B3, b3("2", memory="65536"), whole(2)),  # what HAMi's webhook writes for whole cards
    RequestCase(B3, b3("2", memory="40000"), whole(2)),  # no template holds it: HAMi gives whole cards
    RequestCase(B3, b3("2", memory="40000"), "whole cards only", SOFT),  # a share in soft split
    RequestCase(B3, b3("2", core="100"), whole(2), SOFT),
    RequestCase("Ascend310P", res("Ascend310P", "3", "24576"), whole(3, "Ascend310P")),
    RequestCase("Ascend310P", res("Ascend310P", "3", "24577"), "whole cards only"),
    RequestCase("Ascend910B4-1", res("Ascend910B4-1", "1"), whole(1, "Ascend910B4-1")),
    # super-pod modules: whole 910C cards come in twos; a share of one die stays one device
    RequestCase(C, res(C, "1"), whole(2, C)),
    RequestCase(C, res(C, "4"), whole(4, C)),
    RequestCase(C, res(C, "3"), "ask for an even number"),
    RequestCase(C, res(C, memory="65536"), whole(2, C)),
    RequestCase(C, res(C, memory="32768"), req(C, memory=32768)),
    RequestCase(C, res(C, "1", memory="16384", core="30"), req(C, memory=16384, cores=30), SOFT),
]


def npu(node: str, i: int, kind: str = B3, used: int = 0, usedmem: int = 0, network: int | None = 0) -> DeviceUsage:
    device = Device(
        id=f"{node}-npu{i}", index=i, count=4, devmem=65536, devcore=20, type=kind,
        custom={"NetworkID": network} if network is not None else {},
    )  # fmt: skip
    return DeviceUsage(device=device, used=used, usedmem=usedmem)


def npu_nodes() -> list[NodeView]:
    """An idle eight-NPU server, a busy one, and a soft-split node."""
    soft = [
        DeviceUsage(
            device=Device(id=f"soft-npu{i}", index=i, count=4, devmem=65536, devcore=100, type=B3,
                          custom={"NetworkID": 0}),
            used=1, usedmem=16384, usedcores=30,
        )
        for i in range(2)
    ]  # fmt: skip
    return [
        NodeView(name="idle", devices=[npu("idle", i, network=1 if i > 3 else 0) for i in range(8)]),
        NodeView(name="busy", devices=[npu("busy", 0, used=3, usedmem=49152), npu("busy", 1, used=1, usedmem=32768)]),
        NodeView(name="soft", devices=soft, annotations={"hami-vnpu-core": "true"}),
    ]


_FAKE_NODE: list[Path] = []


def conformance_node() -> Path:
    """A fake npu-smi describing NPUs idle-npu0..7 for the container-edit checks (written once per session)."""
    if not _FAKE_NODE:
        directory = Path(tempfile.mkdtemp(prefix="hami-ascend-conformance-"))
        atexit.register(shutil.rmtree, directory, True)
        rows = []
        for i in range(8):
            rows.append(
                f"| {i}       910B3                 | OK              | 70.0        34                0    / 0 |"
            )
            rows.append(
                f"| 0                             | 0000:{0xC1 + i:02X}:00.0    | 0   1197 / 13553   1365 / 65536 |"
            )
        table = "\n".join(
            [
                "| NPU     Name                  | Health          | Power(W)    Temp(C)     Hugepages-Usage(page) |",
                "| Chip                          | Bus-Id          | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB) |",
                *rows,
            ]
        )
        (directory / "info.txt").write_text(table + "\n")
        script = directory / "npu-smi"
        script.write_text(f'#!/bin/sh\ncat "{directory / "info.txt"}"\n')
        script.chmod(0o755)
        _FAKE_NODE.append(script)
    return _FAKE_NODE[0]


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type=B3, usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))
SOFT_POD = EDIT_POD.model_copy(update={"annotations": SOFT})
BUS = "NPU-0000-{:02X}-00.0"


def make_fixture() -> VendorFixture:
    return VendorFixture(
        name="ascend",
        plugin=plugin,
        config={"dcmiLibrary": "/nonexistent/libdcmi.so", "npuSmi": str(conformance_node())},
        requests=REQUESTS,
        nodes={B3: npu_nodes},
        fit_requests={B3: [req(memory=8000), whole(1), whole(2), req(memory=30000), whole(8)]},
        edits=[
            EditCase(B3, placed((BUS.format(0xC1), 16384, 0)), pod=EDIT_POD),
            EditCase(B3, placed((BUS.format(0xC2), 65536, 0), (BUS.format(0xC3), 65536, 0)), 1, pod=EDIT_POD),
            EditCase(B3, placed((BUS.format(0xC4), 16384, 30)), 1, pod=SOFT_POD),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def test_every_conformance_check_applies() -> None:
    run, skipped = applicable(make_fixture())
    assert not skipped, [(c.name, why) for c, why in skipped]
    assert len(run) >= 10


def plugins(config: Mapping[str, Any] | None = None) -> VendorPlugins:
    return VendorPlugins.from_plugins({"ascend": plugin}, config={"ascend": dict(config or {})})


def read(
    h: VendorPlugins, kind: str, resources: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Any:
    container = Container(name="main", limits=dict(resources))
    pod = Pod(name="p", annotations=dict(annotations or {}), containers=(container,))
    return h.container_request(kind, container, pod)


# --------------------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------------------


def test_one_kind_per_chip_with_hami_names() -> None:
    words = [k.common_word for k in plugin.INFO.kinds]
    assert words == [
        "Ascend910A",
        "Ascend910B2",
        "Ascend910B3",
        "Ascend910B4",
        "Ascend910B4-1",
        "Ascend310P",
        "Ascend910C",
    ]
    kind = plugin.INFO.kind("Ascend910B4-1")
    assert kind.register_format is RegisterFormat.JSON
    assert kind.resources.all() == (
        "huawei.com/Ascend910B4-1",
        "huawei.com/Ascend910B4-1-memory",
        "huawei.com/Ascend910B4-1-core",
    )
    keys = kind.annotations
    assert keys.node_register == "hami.io/node-register-Ascend910B4-1"
    assert keys.node_handshake == "hami.io/node-handshake-Ascend910B4-1"
    assert (keys.to_allocate, keys.allocated) == (
        "hami.io/Ascend910B4-1-devices-to-allocate",
        "hami.io/Ascend910B4-1-devices-allocated",
    )
    assert keys.selectors() == ("hami.io/use-Ascend910B4-1-uuid", "hami.io/no-use-Ascend910B4-1-uuid")
    assert plugin.INFO.isolation_library == "libvnpu.so"


# --------------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------------


def test_core_outside_soft_split_names_resource_and_fix() -> None:
    with pytest.raises(RequestError) as err:
        read(plugins(), B3, b3("1", core="30"))
    assert err.value.resource == "huawei.com/Ascend910B3-core"
    assert "huawei.com/vnpu-mode: hami-core" in str(err.value)


def test_soft_split_as_configured_default() -> None:
    h = plugins({"hamiVnpuMode": "hami-core"})
    assert read(h, B3, b3("1", memory="4096", core="30")) == req(memory=4096, cores=30)
    with pytest.raises(RequestError, match="soft-split"):
        read(h, B3, b3("1", core="30"), {"huawei.com/vnpu-mode": "template"})


def test_multi_device_refusal_names_the_partial_resource() -> None:
    with pytest.raises(RequestError) as err:
        read(plugins(), B3, b3("2", memory="16384"))
    assert err.value.resource == "huawei.com/Ascend910B3-memory"
    assert "ask for 1 device" in str(err.value)


def test_whole_card_memory_follows_configured_chip() -> None:
    chip = {
        "chipName": "910B3",
        "memoryAllocatable": 61440,
        "memoryCapacity": 65536,
        "aiCore": 20,
        "templates": [{"name": "vir10_3c_32g", "memory": 32768, "aiCore": 10}],
    }
    h = plugins({"chips": {B3: chip}})
    assert read(h, B3, b3("2", memory="61440")) == whole(2)
    with pytest.raises(RequestError):
        read(h, B3, b3("2", memory="32768"))  # a template's memory: a share


def test_super_pod_pairing_follows_the_configured_chip() -> None:
    chip = {"chipName": "Ascend910", "memoryAllocatable": 65536, "memoryCapacity": 65536, "aiCore": 20}
    h = plugins({"chips": {C: chip}})  # superPod not set: dies are placed one by one
    assert read(h, C, res(C, "1")) == whole(1, C)
    assert read(h, C, res(C, "3")) == whole(3, C)


def test_the_mode_annotation_does_not_matter_to_other_vendors_pods() -> None:
    assert read(plugins(), B3, {"cpu": "1"}, {"huawei.com/vnpu-mode": "nonsense"}) is None


# --------------------------------------------------------------------------------------------------------
# Admission defaults
# --------------------------------------------------------------------------------------------------------


def admit(
    h: VendorPlugins, kind: str, resources: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> Any:
    container = Container(name="main", limits=dict(resources))
    pod = Pod(name="p", annotations=dict(annotations or {}), containers=(container,))
    return h.admission_defaults(kind, container, pod)


def test_a_single_super_pod_card_is_written_back_as_a_module() -> None:
    edit = admit(plugins(), C, res(C, "1"))
    assert dict(edit.limits) == {"huawei.com/Ascend910C": "2"}
    assert admit(plugins(), C, res(C, "2")) is None
    assert dict(admit(plugins(), C, res(C, memory="65536")).limits) == {"huawei.com/Ascend910C": "2"}
    assert admit(plugins(), C, res(C, "1", memory="16384")) is None  # a share of one die


def test_the_configured_runtime_class_is_set() -> None:
    edit = admit(plugins({"runtimeClassName": "ascend"}), B3, b3("1", memory="8000"))
    assert edit.runtime_class_name == "ascend"
    assert dict(edit.limits) == {}
    assert admit(plugins(), B3, b3("1", memory="8000")) is None


# --------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------

HAMI_TEMPLATES = {
    "Ascend910A": [("vir02", 2184, 2), ("vir04", 4369, 4), ("vir08", 8738, 8), ("vir16", 17476, 16)],
    "Ascend910B2": [("vir03_1c_8g", 8192, 3), ("vir06_1c_16g", 16384, 6), ("vir12_3c_32g", 32768, 12)],
    "Ascend910B3": [("vir05_1c_16g", 16384, 5), ("vir10_3c_32g", 32768, 10)],
    "Ascend910B4": [("vir05_1c_8g", 8192, 5), ("vir10_3c_16g", 16384, 10)],
    "Ascend310P": [("vir01", 3072, 1), ("vir02", 6144, 2), ("vir04", 12288, 4)],
    "Ascend910C": [("vir05_1c_16g", 16384, 5), ("vir10_3c_32g", 32768, 10)],
    "Ascend910B4-1": [],
}


def test_default_templates() -> None:
    settings = AscendSettings()
    assert settings.default_vnpu_mode == "template"
    assert set(settings.chips) == set(plugin.COMMON_WORDS)
    for word, templates in HAMI_TEMPLATES.items():
        assert [(t.name, t.memory, t.ai_core) for t in settings.chips[word].templates] == templates, word
    assert settings.chips["Ascend310P"].chip_name == "310P3"
    assert (settings.chips["Ascend310P"].memory_allocatable, settings.chips["Ascend310P"].memory_capacity) == (
        21527,
        24576,
    )
    assert [w for w, c in settings.chips.items() if c.super_pod] == ["Ascend910C"]


def test_split_count_and_registered_cores_follow_hami() -> None:
    settings = AscendSettings()
    counts = {w: settings.split_count(w) for w in plugin.COMMON_WORDS}
    assert counts == {
        "Ascend910A": 15,  # 32768 // 2184
        "Ascend910B2": 8,
        "Ascend910B3": 4,
        "Ascend910B4": 4,
        "Ascend910B4-1": 1,  # no templates: whole cards only
        "Ascend310P": 7,  # 21527 // 3072
        "Ascend910C": 4,
    }
    assert settings.registered_cores(B3) == 20
    soft = AscendSettings.model_validate({"hamiVnpuCore": True, "deviceCoreScaling": 1.5, "deviceSplitCount": 10})
    assert (soft.registered_cores(B3), soft.split_count(B3)) == (150, 10)


def test_template_names_spell_their_cores_and_memory() -> None:
    for chip in AscendSettings().chips.values():
        for t in chip.templates:
            if "_" in t.name:  # vir<cores>_<cpus>c_<GiB>g
                cores, cpus, gib = t.name.removeprefix("vir").split("_")
                assert (int(cores), int(cpus.removesuffix("c")), int(gib.removesuffix("g")) * 1024) == (
                    t.ai_core,
                    t.ai_cpu,
                    t.memory,
                ), t.name


def test_configured_chip_replaces_builtin_and_sorts_templates() -> None:
    chip = {
        "chipName": "Ascend910",
        "memoryAllocatable": 65536,
        "memoryCapacity": 65536,
        "aiCore": 24,
        "templates": [
            {"name": "vir12_3c_32g", "memory": 32768, "aiCore": 12},
            {"name": "vir06_1c_16g", "memory": 16384, "aiCore": 6},
        ],
    }
    settings = AscendSettings.model_validate({"chips": {"Ascend910C": chip}})
    assert [t.name for t in settings.chips["Ascend910C"].templates] == ["vir06_1c_16g", "vir12_3c_32g"]
    assert settings.chips[B3] == AscendSettings().chips[B3]
    tmpl = settings.chips["Ascend910C"]
    assert [tmpl.template_for(m) for m in (1, 16384, 16385, 32768, 32769)] == [
        tmpl.templates[0],
        tmpl.templates[0],
        tmpl.templates[1],
        tmpl.templates[1],
        None,
    ]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"chips": {"Ascend999": {}}}, "unknown Ascend chip Ascend999"),
        ({"hamiVnpuMode": "soft"}, "hamiVnpuMode"),
        (
            {"chips": {B3: {"chipName": "910B3", "memoryAllocatable": 70000, "memoryCapacity": 65536, "aiCore": 20}}},
            "more than",
        ),
        (
            {
                "chips": {
                    B3: {
                        "chipName": "910B3",
                        "memoryAllocatable": 1,
                        "memoryCapacity": 2,
                        "aiCore": 20,
                        "templates": [{"name": "big", "memory": 3, "aiCore": 1}],
                    }
                }
            },
            "bigger than the chip",
        ),
        ({"defaultMem": 1}, "defaultMem"),
        ({"deviceCoreScaling": 0.5}, "deviceCoreScaling"),
        ({"driverMounts": ["relative/path"]}, "not an absolute host path"),
    ],
)
def test_bad_settings_refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AscendSettings.model_validate(raw)
    with pytest.raises(ConfigError, match="ascend"):
        plugins(raw)
