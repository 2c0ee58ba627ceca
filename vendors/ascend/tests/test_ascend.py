"""The Ascend plugin: the conformance kit, the soft-split and whole-card rules, and the chip settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from hami.errors import ConfigError, RequestError
from hami.model import Container, ContainerRequest, Pod, RegisterFormat
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_ascend import plugin
from hami_vendor_ascend.plugin import AscendSettings

B3 = "Ascend910B3"
SOFT = {"huawei.com/vnpu-mode": "hami-core"}


def req(
    kind: str = B3, count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


def whole(count: int, kind: str = B3) -> ContainerRequest:
    return req(kind, count, percent=100, cores=100)


def b3(count: str | None = None, memory: str | None = None, core: str | None = None) -> dict[str, str]:
    resources = {"huawei.com/Ascend910B3": count, "huawei.com/Ascend910B3-memory": memory}
    resources["huawei.com/Ascend910B3-core"] = core
    return {k: v for k, v in resources.items() if v is not None}


REQUESTS = [
    # whole cards and shares in template mode
    RequestCase(B3, b3("1"), whole(1)),
    RequestCase(B3, b3("4"), whole(4)),
    RequestCase(B3, b3("1", memory="16384"), req(memory=16384)),
    RequestCase(B3, b3(memory="8000"), req(memory=8000)),
    RequestCase(B3, b3("0"), None),
    RequestCase(B3, b3("1", memory="16Gi"), "write 16384"),
    # -core only in soft-split mode
    RequestCase(B3, b3("1", memory="16384", core="40"), "huawei.com/vnpu-mode: hami-core"),
    RequestCase(B3, b3("1", core="40"), "add the pod annotation", {"huawei.com/vnpu-mode": "template"}),
    RequestCase(B3, b3("1", memory="28672", core="40"), req(memory=28672, cores=40), SOFT),
    RequestCase(B3, b3(core="25"), req(percent=100, cores=25), SOFT),
    RequestCase(B3, b3("1", core="101"), "more than 100", SOFT),
    RequestCase(B3, b3("1"), "is not a vNPU mode", {"huawei.com/vnpu-mode": "hamicore"}),
    # several devices are whole cards only
    RequestCase(B3, b3("2", memory="16384"), "whole cards only"),
    RequestCase(B3, b3("2", core="40"), "whole cards only", SOFT),
    RequestCase(B3, b3("2", memory="65536"), whole(2)),  # what HAMi's webhook writes for whole cards
    RequestCase(B3, b3("2", core="100"), whole(2), SOFT),
    RequestCase(
        "Ascend310P", {"huawei.com/Ascend310P": "3", "huawei.com/Ascend310P-memory": "24576"}, whole(3, "Ascend310P")
    ),
    RequestCase(
        "Ascend310P", {"huawei.com/Ascend310P": "3", "huawei.com/Ascend310P-memory": "24577"}, "whole cards only"
    ),
    RequestCase("Ascend910B4-1", {"huawei.com/Ascend910B4-1": "1"}, whole(1, "Ascend910B4-1")),
    RequestCase("Ascend910C", {"huawei.com/Ascend910C-memory": "32768"}, req("Ascend910C", memory=32768)),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="ascend", plugin=plugin, requests=REQUESTS)


test_conformance = pytest_suite(make_fixture)


def host(config: Mapping[str, Any] | None = None) -> VendorHost:
    return VendorHost.from_plugins({"ascend": plugin}, config={"ascend": dict(config or {})})


def read(h: VendorHost, kind: str, resources: Mapping[str, str], annotations: Mapping[str, str] | None = None) -> Any:
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


# --------------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------------


def test_core_outside_soft_split_names_resource_and_fix() -> None:
    with pytest.raises(RequestError) as err:
        read(host(), B3, b3("1", core="30"))
    assert err.value.resource == "huawei.com/Ascend910B3-core"
    assert "huawei.com/vnpu-mode: hami-core" in str(err.value)


def test_soft_split_as_configured_default() -> None:
    h = host({"hamiVnpuMode": "hami-core"})
    assert read(h, B3, b3("1", memory="4096", core="30")) == req(memory=4096, cores=30)
    with pytest.raises(RequestError, match="soft-split"):
        read(h, B3, b3("1", core="30"), {"huawei.com/vnpu-mode": "template"})


def test_multi_device_refusal_names_the_partial_resource() -> None:
    with pytest.raises(RequestError) as err:
        read(host(), B3, b3("2", memory="16384"))
    assert err.value.resource == "huawei.com/Ascend910B3-memory"
    assert "ask for 1 device" in str(err.value)


def test_whole_card_memory_follows_configured_chip() -> None:
    chip = {"chipName": "910B3", "memoryAllocatable": 61440, "memoryCapacity": 65536, "aiCore": 20}
    h = host({"chips": {B3: chip}})
    assert read(h, B3, b3("2", memory="61440")) == whole(2)
    with pytest.raises(RequestError):
        read(h, B3, b3("2", memory="32768"))


def test_the_mode_annotation_does_not_matter_to_other_vendors_pods() -> None:
    assert read(host(), B3, {"cpu": "1"}, {"huawei.com/vnpu-mode": "nonsense"}) is None


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
    ],
)
def test_bad_settings_refused(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        AscendSettings.model_validate(raw)
    with pytest.raises(ConfigError, match="ascend"):
        host(raw)
