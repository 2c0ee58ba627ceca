"""The MetaX plugin: the conformance kit, whole and shared cards, GiB memory and the sGPU pod annotations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from hami.errors import ConfigError, RequestError
from hami.model import Container, ContainerRequest, Pod, RegisterFormat
from hami.plugins import VendorHost
from hami.testing.conformance import RequestCase, VendorFixture, pytest_suite
from hami_vendor_metax import plugin

GPU, SGPU = "Metax-GPU", "Metax-SGPU"
WHOLE = "metax-tech.com/gpu"
COUNT, MEMORY, CORES = "metax-tech.com/sgpu", "metax-tech.com/vmemory", "metax-tech.com/vcore"
QOS, APP = "metax-tech.com/sgpu-qos-policy", "metax-tech.com/sgpu-app-class"


def req(
    count: int = 1, memory: int = 0, percent: int | None = None, cores: int = 0, kind: str = SGPU
) -> ContainerRequest:
    return ContainerRequest(kind=kind, count=count, memory=memory, memory_percentage=percent, cores=cores)


REQUESTS = [
    # whole cards
    RequestCase(GPU, {WHOLE: "1"}, req(percent=100, cores=100, kind=GPU)),
    RequestCase(GPU, {WHOLE: "4"}, req(4, percent=100, cores=100, kind=GPU)),
    RequestCase(GPU, {WHOLE: "0"}, None),
    RequestCase(GPU, {WHOLE: "one"}, "plain non-negative integer"),
    # shared cards, memory in GiB, whole compute unless vcore says otherwise
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100)),
    RequestCase(SGPU, {COUNT: "1", MEMORY: "8"}, req(memory=8192, cores=100)),
    RequestCase(SGPU, {COUNT: "2", MEMORY: "8", CORES: "30"}, req(2, memory=8192, cores=30)),
    RequestCase(SGPU, {CORES: "50"}, req(percent=100, cores=50)),
    RequestCase(SGPU, {COUNT: "1", MEMORY: "8Gi"}, "counts 1024 MiB"),
    RequestCase(SGPU, {COUNT: "1", CORES: "120"}, req(percent=100, cores=100)),  # HAMi clamps cores at 100
    # QoS policy and app class
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "fixed-share"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "burst-share"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {QOS: "best-effort"}),
    RequestCase(SGPU, {COUNT: "1"}, "best-effort, fixed-share, burst-share", {QOS: "guaranteed"}),
    RequestCase(SGPU, {COUNT: "1"}, req(percent=100, cores=100), {APP: "online", QOS: "ignored-when-online"}),
    RequestCase(SGPU, {COUNT: "1"}, "online, offline", {APP: "batch"}),
    RequestCase(SGPU, {COUNT: "2"}, "single-device", {APP: "offline"}),
    RequestCase(GPU, {WHOLE: "1"}, req(percent=100, cores=100, kind=GPU), {QOS: "guaranteed"}),
]


def make_fixture() -> VendorFixture:
    return VendorFixture(name="metax", plugin=plugin, requests=REQUESTS)


test_conformance = pytest_suite(make_fixture)


def read(
    kind: str,
    resources: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> ContainerRequest | None:
    host = VendorHost.from_plugins({"metax": plugin}, config={"metax": dict(config or {})})
    container = Container(name="main", limits=dict(resources))
    return host.container_request(
        kind, container, Pod(name="p", annotations=dict(annotations or {}), containers=(container,))
    )


def test_metadata_is_hami_wiring() -> None:
    gpu, sgpu = plugin.INFO.kinds
    assert (gpu.common_word, sgpu.common_word) == (GPU, SGPU)
    assert gpu.resources.all() == (WHOLE,)
    assert sgpu.resources.all() == (COUNT, MEMORY, CORES)
    assert sgpu.resources.memory_unit_mib == 1024
    for kind, word in ((gpu, "gpu"), (sgpu, "sgpu")):
        assert kind.register_format is RegisterFormat.CAPACITY
        assert (kind.annotations.to_allocate, kind.annotations.allocated) == (
            f"hami.io/metax-{word}-devices-to-allocate",
            f"hami.io/metax-{word}-devices-allocated",
        )
        assert kind.annotations.selectors() == ("metax-tech.com/use-gpuuuid", "metax-tech.com/nouse-gpuuuid")


def test_qos_refusal_names_annotation() -> None:
    with pytest.raises(RequestError) as err:
        read(SGPU, {COUNT: "1"}, {QOS: "Fixed-Share"})
    assert err.value.resource == QOS


def test_annotations_do_not_matter_without_a_request() -> None:
    assert read(SGPU, {COUNT: "0"}, {QOS: "guaranteed"}) is None


def test_defaults_apply_to_shared_cards_only() -> None:
    config = {"defaultMem": 4096, "defaultCores": 40}
    assert read(SGPU, {COUNT: "1"}, config=config) == req(memory=4096, cores=40)
    assert read(GPU, {WHOLE: "1"}, config=config) == req(percent=100, cores=100, kind=GPU)


def test_bad_settings_refused() -> None:
    with pytest.raises(ConfigError, match="metax"):
        read(SGPU, {COUNT: "1"}, config={"sgpuQosPolicy": "x"})
