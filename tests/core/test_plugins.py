"""The vendor plugins (`hami.plugins`): loading, refusing broken plugins, disabling, routing hooks to the owner."""

from __future__ import annotations

import dataclasses
import logging
import types
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel

from hami import hookimpl
from hami.errors import ConfigError, PluginError
from hami.model import (
    Allocation,
    AnnotationKeys,
    Container,
    ContainerDevice,
    ContainerEdits,
    ContainerRequest,
    DeviceKind,
    IsolationLibrary,
    NodeView,
    Pod,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.plugins import PluginSource, VendorPlugins, installed_sources

ALL_VENDORS = {
    "nvidia",
    "ascend",
    "cambricon",
    "hygon",
    "iluvatar",
    "mthreads",
    "metax",
    "enflame",
    "awsneuron",
    "biren",
}


def make_kind(word: str, domain: str) -> DeviceKind:
    return DeviceKind(
        common_word=word,
        resources=ResourceNames(count=f"{domain}/dev", memory=f"{domain}/mem", cores=f"{domain}/cores"),
        annotations=AnnotationKeys(
            node_register=f"hami.io/node-{word.lower()}-register",
            to_allocate=f"hami.io/{word.lower()}-devices-to-allocate",
            allocated=f"hami.io/{word.lower()}-devices-allocated",
        ),
    )


def module(name: str, **attrs: Any) -> types.ModuleType:
    """A plugin module built in memory, as an entry point would import it."""
    mod = types.ModuleType(f"hami_vendor_{name}.plugin")
    for key, value in attrs.items():
        setattr(mod, key, value)
    return mod


def make_plugin(name: str, word: str, domain: str, **hooks: Any) -> types.ModuleType:
    """A vendor plugin module with `hami_vendor_info` and any extra hook functions given."""
    info = VendorInfo(name=name, display_name=name.title(), kinds=(make_kind(word, domain),))

    @hookimpl
    def hami_vendor_info() -> VendorInfo:
        return info

    return module(name, hami_vendor_info=hami_vendor_info, **hooks)


def source(name: str, plugin: object, distribution: str | None = None) -> PluginSource:
    return PluginSource(name, distribution or f"hami-vendor-{name}", "1.0", lambda: plugin)


def test_installed_vendors_all_load_with_their_distributions() -> None:
    plugins = VendorPlugins.load(disabled=())
    loaded = {v.name: v.distribution for v in plugins.vendors}
    assert set(loaded) >= ALL_VENDORS
    assert loaded["nvidia"] == "hami-vendor-nvidia"
    assert not plugins.failed


def test_plugin_whose_import_fails_is_skipped_and_named(caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> object:
        raise ImportError("libfoo.so: cannot open shared object file")

    sources = [s if s.name != "ascend" else dataclasses.replace(s, load=broken) for s in installed_sources()]
    with caplog.at_level(logging.ERROR, logger="hami.plugins"):
        plugins = VendorPlugins.load(sources=sources, disabled=())
    assert {v.name for v in plugins.vendors} >= ALL_VENDORS - {"ascend"}
    assert "ascend" not in {v.name for v in plugins.vendors}
    (failure,) = plugins.failed
    assert failure.entry_point == "ascend"
    assert failure.distribution == "hami-vendor-ascend"
    assert "libfoo.so" in failure.error
    assert "hami-vendor-ascend" in caplog.text


def test_misspelled_hook_is_refused_with_a_suggestion() -> None:
    @hookimpl
    def hami_fit_node(kind: DeviceKind) -> None:  # the contract's hook is hami_fit_nodes
        return None

    bad = make_plugin("typo", "TYPO", "typo.example.com", hami_fit_node=hami_fit_node)
    good = make_plugin("fine", "FINE", "fine.example.com")
    plugins = VendorPlugins.load(sources=[source("typo", bad), source("fine", good)], disabled=())
    assert [v.name for v in plugins.vendors] == ["fine"]
    assert "hami_fit_node is not a hook of the contract; did you mean hami_fit_nodes?" in plugins.failed[0].error


def test_a_hook_of_the_contract_left_unmarked_is_refused() -> None:
    """pluggy calls only marked functions: an unmarked hami_device_readings would leave the vendor's readings silently
    absent (as a merge once did to two vendors), so the plugin is refused, naming it."""

    def hami_device_readings() -> None:  # no @hookimpl
        return None

    bad = make_plugin("unmarked", "UNMARKED", "unmarked.example.com", hami_device_readings=hami_device_readings)
    good = make_plugin("fine", "FINE", "fine.example.com")
    plugins = VendorPlugins.load(sources=[source("unmarked", bad), source("fine", good)], disabled=())
    assert [v.name for v in plugins.vendors] == ["fine"]
    assert "hami_device_readings is a hook of the contract but is not marked @hookimpl" in plugins.failed[0].error


def test_hook_with_an_argument_the_spec_lacks_is_refused() -> None:
    @hookimpl
    def hami_container_request(kind: DeviceKind, container: Container, gpu_count: int) -> None:
        return None

    bad = make_plugin("args", "ARGS", "args.example.com", hami_container_request=hami_container_request)
    plugins = VendorPlugins.load(sources=[source("args", bad)], disabled=())
    assert not plugins.vendors
    assert "gpu_count" in plugins.failed[0].error


def test_strict_loading_raises_instead_of_skipping() -> None:
    bad = module("empty")  # no hami_vendor_info at all
    with pytest.raises(PluginError, match="does not implement hami_vendor_info"):
        VendorPlugins.load(sources=[source("empty", bad)], disabled=(), strict=True)


def test_disabled_vendors_env_switches_vendors_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAMI_DISABLED_VENDORS", "nvidia, hygon")
    plugins = VendorPlugins.load()
    names = {v.name for v in plugins.vendors}
    assert "nvidia" not in names
    assert "hygon" not in names
    assert {d.entry_point for d in plugins.disabled} == {"nvidia", "hygon"}
    assert ALL_VENDORS - {"nvidia", "hygon"} <= names


def test_second_vendor_claiming_a_resource_is_refused() -> None:
    first = make_plugin("first", "ONE", "same.example.com")
    second = make_plugin("second", "TWO", "same.example.com")
    plugins = VendorPlugins.load(sources=[source("first", first), source("second", second)], disabled=())
    assert [v.name for v in plugins.vendors] == ["first"]
    assert "resource same.example.com/dev is already claimed by kind ONE" in plugins.failed[0].error


def test_second_vendor_with_the_same_common_word_is_refused() -> None:
    first = make_plugin("first", "ACC", "one.example.com")
    second = make_plugin("second", "ACC", "two.example.com")
    plugins = VendorPlugins.load(sources=[source("first", first), source("second", second)], disabled=())
    assert "device kind 'ACC' is already served by vendor first" in plugins.failed[0].error


def test_vendor_info_of_the_wrong_type_is_refused() -> None:
    @hookimpl
    def hami_vendor_info() -> dict[str, str]:
        return {"name": "dicty"}

    plugins = VendorPlugins.load(sources=[source("dicty", module("dicty", hami_vendor_info=hami_vendor_info))])
    assert "returned dict, not VendorInfo" in plugins.failed[0].error


class _Settings(BaseModel):
    split: int = 10


def test_invalid_vendor_configuration_is_a_config_error_naming_the_vendor() -> None:
    @hookimpl
    def hami_vendor_settings(raw: Mapping[str, Any]) -> _Settings:
        return _Settings.model_validate(raw)

    plugin = make_plugin("conf", "CONF", "conf.example.com", hami_vendor_settings=hami_vendor_settings)
    plugins = VendorPlugins.load(sources=[source("conf", plugin)], config={"conf": {"split": 4}})
    assert plugins.vendor("conf").settings == _Settings(split=4)
    with pytest.raises(ConfigError, match=r"vendors\.conf\.split: Input should be a valid integer"):
        VendorPlugins.load(sources=[source("conf", plugin)], config={"conf": {"split": "many"}})


def test_routed_hooks_reach_only_the_owning_vendor() -> None:
    calls: list[str] = []

    def requester(name: str) -> Any:
        @hookimpl
        def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest:
            calls.append(name)
            return ContainerRequest(kind=kind.common_word, count=1)

        return hami_container_request

    a = make_plugin("alpha", "ALPHA", "alpha.example.com", hami_container_request=requester("alpha"))
    b = make_plugin("beta", "BETA", "beta.example.com", hami_container_request=requester("beta"))
    plugins = VendorPlugins.from_plugins({"alpha": a, "beta": b})
    container = Container(name="c", limits={"beta.example.com/dev": "1"})
    pod = Pod(name="p", containers=(container,))
    assert plugins.pod_requests(pod) == {"BETA": [ContainerRequest(kind="BETA", count=1)]}
    assert calls == ["beta"]


def test_pod_requests_are_positional_with_init_containers_first() -> None:
    @hookimpl
    def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest:
        return ContainerRequest(kind=kind.common_word, count=int(container.limits[kind.resources.count]))

    plugin = make_plugin("pos", "POS", "pos.example.com", hami_container_request=hami_container_request)
    plugins = VendorPlugins.from_plugins({"pos": plugin})
    pod = Pod(
        name="p",
        init_containers=(Container(name="init", limits={"pos.example.com/dev": "2"}),),
        containers=(Container(name="a"), Container(name="b", limits={"pos.example.com/dev": "1"})),
    )
    requests = plugins.pod_requests(pod)["POS"]
    assert [r.count if r else None for r in requests] == [2, None, 1]


def test_fit_on_a_vendor_without_fitting_refuses_every_node_with_a_reason() -> None:
    plugin = make_plugin("nofit", "NOFIT", "nofit.example.com")
    plugins = VendorPlugins.from_plugins({"nofit": plugin})
    fits = plugins.fit_nodes("NOFIT", Pod(name="p"), [None], [NodeView(name="n1")], SchedulingPolicy())
    assert fits[0].reason == "vendor nofit cannot place NOFIT devices yet"


def test_a_plugin_added_later_does_not_receive_calls_routed_to_an_earlier_one() -> None:
    calls: list[str] = []

    def requester(name: str) -> Any:
        @hookimpl
        def hami_container_request(kind: DeviceKind) -> ContainerRequest:
            calls.append(name)
            return ContainerRequest(kind=kind.common_word, count=1)

        return hami_container_request

    plugins = VendorPlugins.from_plugins(
        {"a": make_plugin("a", "A", "a.example.com", hami_container_request=requester("a"))}
    )
    pod = Pod(name="p", containers=(Container(name="c", limits={"a.example.com/dev": "1"}),))
    plugins.pod_requests(pod)
    plugins.add(
        make_plugin("b", "B", "b.example.com", hami_container_request=requester("b")),
        source("b", None),
    )
    plugins.pod_requests(pod)
    assert calls == ["a", "a"]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (None, Allocation(devices=(ContainerDevice(uuid="D-0", type="DEV"),))),
        ((ContainerDevice(uuid="P-0", type="DEV"),), Allocation(devices=(ContainerDevice(uuid="P-0", type="DEV"),))),
        (
            Allocation(devices=(ContainerDevice(uuid="P-0", type="DEV"),), pod_annotations={"example.com/part": "7"}),
            Allocation(devices=(ContainerDevice(uuid="P-0", type="DEV"),), pod_annotations={"example.com/part": "7"}),
        ),
    ],
)
def test_allocate_answers_of_every_accepted_shape_become_an_allocation(answer: Any, expected: Allocation) -> None:
    @hookimpl
    def hami_allocate(devices: Any) -> Any:
        return answer

    plugins = VendorPlugins.from_plugins({"dev": make_plugin("dev", "DEV", "dev.example", hami_allocate=hami_allocate)})
    recorded = (ContainerDevice(uuid="D-0", type="DEV"),)
    assert plugins.allocate("DEV", Pod(name="p"), 0, recorded) == expected


def test_container_edits_are_given_the_installed_library_only_when_they_ask_for_it() -> None:
    seen: list[IsolationLibrary | None] = []

    @hookimpl
    def hami_container_edits(library: IsolationLibrary | None) -> ContainerEdits:
        seen.append(library)
        return ContainerEdits()

    plugins = VendorPlugins.from_plugins(
        {"dev": make_plugin("dev", "DEV", "dev.example", hami_container_edits=hami_container_edits)}
    )
    library = IsolationLibrary(path="/hooks/dev/libdev.so", preload_path="/hooks/dev/ld.so.preload")
    plugins.container_edits("DEV", Pod(name="p"), 0, (), library)
    plugins.container_edits("DEV", Pod(name="p"), 0, ())
    assert seen == [library, None]

    @hookimpl
    def older_edits(devices: Any) -> ContainerEdits:  # written before the library was passed
        return ContainerEdits(env={"N": str(len(devices))})

    older = VendorPlugins.from_plugins(
        {"old": make_plugin("old", "OLD", "old.example", hami_container_edits=older_edits)}
    )
    assert older.container_edits("OLD", Pod(name="p"), 0, (), library).env == {"N": "0"}


def test_a_vendor_without_container_edits_is_warned_about_once_when_its_devices_are_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugins = VendorPlugins.from_plugins({"bare": make_plugin("bare", "BARE", "bare.example")})
    placed = (ContainerDevice(uuid="B-0", type="BARE"),)
    with caplog.at_level(logging.WARNING, logger="hami.plugins"):
        assert plugins.container_edits("BARE", Pod(name="p"), 0, ()) == ContainerEdits()  # nothing placed: no warning
        assert caplog.records == []
        assert plugins.container_edits("BARE", Pod(name="p"), 0, placed) == ContainerEdits()
        plugins.container_edits("BARE", Pod(name="q"), 0, placed)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage().startswith("vendor bare (")
    assert "implements no hami_container_edits" in record.getMessage()
    assert "BARE devices get no environment" in record.getMessage()
