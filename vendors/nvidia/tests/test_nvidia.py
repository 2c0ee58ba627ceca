"""NVIDIA's request rules, admission defaults and settings, and hami-core's conformance kit with fit and edit
material so that every check applies."""

from __future__ import annotations

import json

import pytest

import hami_vendor_nvidia.plugin as plugin
from hami.errors import RequestError
from hami.model import AdmissionEdit, Container, ContainerDevice, ContainerRequest, Device, DeviceUsage, NodeView, Pod
from hami.plugins import VendorPlugins
from hami.testing.conformance import EditCase, RequestCase, VendorFixture, applicable, pytest_suite
from hami_vendor_nvidia.mig import MIG_INSTANCES_ANNOTATION, MigProfile, Placement

GPU, MEM, PCT, CORES = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"
PRIORITY = "nvidia.com/priority"


def want(count: int, memory: int = 0, percentage: int | None = None, cores: int = 0) -> ContainerRequest:
    return ContainerRequest(kind="NVIDIA", count=count, memory=memory, memory_percentage=percentage, cores=cores)


# --------------------------------------------------------------------------------------------------------
# The conformance kit
# --------------------------------------------------------------------------------------------------------

A100_PROFILES = (
    MigProfile("1g.5gb", 4864, 14, 1, tuple(Placement(i, 1) for i in range(7))),
    MigProfile("2g.10gb", 9856, 28, 2, (Placement(0, 2), Placement(2, 2), Placement(4, 2))),
    MigProfile("3g.20gb", 19968, 42, 3, (Placement(0, 4), Placement(4, 4))),
    MigProfile("7g.40gb", 40192, 100, 7, (Placement(0, 8),)),
)


def gpu_nodes() -> list[NodeView]:
    """A T4/V100 node with some GPUs in use, an idle 8×A100 node, and an A100 node in MIG mode."""

    def gpu(node: str, i: int, model: str, memory: int, used: int = 0, usedmem: int = 0, cores: int = 0) -> DeviceUsage:
        device = Device(id=f"GPU-{node}-{i}", index=i, count=10, devmem=memory, devcore=100, type=model, numa=i // 4)
        return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=cores)

    def mig(i: int, used: int = 0, usedmem: int = 0, cores: int = 0) -> DeviceUsage:
        device = Device(
            id=f"GPU-mig-{i}", index=i, count=7, devmem=40960, devcore=100, type="NVIDIA A100-SXM4-40GB",
            mode="mig", mig_profiles=tuple(p.to_register() for p in A100_PROFILES),
        )  # fmt: skip
        return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=cores)

    mixed = [
        gpu("mixed", 0, "NVIDIA-Tesla T4", 15360, 2, 12000, 60),
        gpu("mixed", 1, "NVIDIA-Tesla V100", 32768, 1, 4000),
    ]
    taken = [
        {"gpuUUID": "GPU-mig-0", "profile": "3g.20gb", "placement": {"start": 4, "size": 4}},
        {"gpuUUID": "GPU-mig-1", "profile": "1g.5gb", "placement": {"start": 0, "size": 1}},
    ]
    return [
        NodeView(name="mixed", devices=mixed),
        NodeView(name="a100", devices=[gpu("a100", i, "NVIDIA-A100", 81920) for i in range(8)]),
        NodeView(
            name="mig",
            devices=[mig(0, 1, 19968, 42), mig(1, 1, 4864, 14), mig(2)],
            annotations={MIG_INSTANCES_ANNOTATION: json.dumps(taken)},
        ),
    ]


def placed(*devices: tuple[str, int, int]) -> tuple[ContainerDevice, ...]:
    return tuple(ContainerDevice(uuid=u, type="NVIDIA", usedmem=m, usedcores=c) for u, m, c in devices)


EDIT_POD = Pod(name="edit", uid="uid-edit", containers=(Container(name="a"), Container(name="b")))


def make_fixture(config: dict[str, object] | None = None) -> VendorFixture:
    return VendorFixture(
        name="nvidia",
        plugin=plugin,
        config=config or {},
        requests=[
            RequestCase("NVIDIA", {GPU: "1", MEM: "3000"}, want(1, 3000)),
            RequestCase("NVIDIA", {GPU: "2", MEM: "3000", CORES: "30"}, want(2, 3000, cores=30)),
            RequestCase("NVIDIA", {GPU: "1", PCT: "50"}, want(1, percentage=50)),
            RequestCase("NVIDIA", {MEM: "1024"}, want(1, 1024)),
            RequestCase("NVIDIA", {GPU: "1"}, want(1, percentage=100, cores=100)),
            RequestCase("NVIDIA", {GPU: "0"}, None),
            RequestCase("NVIDIA", {GPU: "1", MEM: "3Gi"}, "so write 3072"),
            # HAMi's normalisations: cores above 100 are 100, an absolute memory wins over a percentage
            RequestCase("NVIDIA", {GPU: "1", CORES: "150"}, want(1, percentage=100, cores=100)),
            RequestCase("NVIDIA", {GPU: "1", MEM: "1000", PCT: "20"}, want(1, 1000)),
            RequestCase("NVIDIA", {GPU: "1", PCT: "101"}, "largest legal value"),
            RequestCase("NVIDIA", {GPU: "1", MEM: "8000"}, want(1, 8000), {"nvidia.com/vgpu-mode": "mig"}),
        ],
        nodes={"NVIDIA": gpu_nodes},
        fit_requests={
            "NVIDIA": [want(1, 3000, cores=30), want(2, percentage=50), want(1, 20000), want(8), want(1, 9000)]
        },
        edits=[
            EditCase("NVIDIA", placed(("GPU-a100-0", 3000, 30)), pod=EDIT_POD),
            EditCase("NVIDIA", placed(("GPU-a100-1", 2000, 0), ("GPU-a100-2", 2000, 0)), 1, pod=EDIT_POD),
            EditCase("NVIDIA", placed(("MIG-5e4f3a2b-0001-0000-0002-000000002222", 9856, 28)), pod=EDIT_POD),
        ],
    )


test_conformance = pytest_suite(make_fixture)


def test_every_conformance_check_applies() -> None:
    run, skipped = applicable(make_fixture())
    assert not skipped, [(c.name, why) for c, why in skipped]
    assert len(run) >= 10


# --------------------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------------------


def plugins_with(**config: object) -> VendorPlugins:
    return VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": config})


def read(resources: dict[str, str], **config: object) -> ContainerRequest | None:
    pod = Pod(name="p", containers=(Container(name="c", limits=resources),))
    return plugins_with(**config).container_request("NVIDIA", pod.containers[0], pod)


def test_count_alone_takes_the_configured_default_memory_and_cores() -> None:
    assert read({GPU: "1"}, defaultMemory=4096, defaultCores=20) == want(1, 4096, cores=20)
    assert read({GPU: "1"}, defaultMem=4096) == want(1, 4096)  # the spelling of earlier configurations


def test_memory_without_a_count_takes_default_gpu_num() -> None:
    assert read({MEM: "2000"}, defaultGPUNum=2) == want(2, 2000)
    assert read({MEM: "2000"}, defaultGPUNum=0) is None


def test_requests_fall_back_to_resource_requests_when_limits_are_absent() -> None:
    container = Container(name="c", requests={GPU: "1", MEM: "2000"})
    assert plugins_with().container_request("NVIDIA", container, Pod(name="p", containers=(container,))) == want(
        1, 2000
    )


def test_negative_memory_is_refused() -> None:
    with pytest.raises(RequestError, match=r"nvidia\.com/gpumem"):
        read({GPU: "1", MEM: "-5"})


# --------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------


def test_unknown_setting_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match=r"gpuSplit"):
        plugins_with(gpuSplit=3)


def test_a_misspelled_mig_profile_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'1g10gb' is not a MIG profile name"):
        plugins_with(migProfileAllowlist=[{"models": ["A100"], "profiles": ["1g10gb"]}])


def test_hamis_option_names_are_read() -> None:
    settings = plugins_with(
        deviceSplitCount=4, deviceMemoryScaling=1.5, deviceCoreScaling=2, gpuCorePolicy="force",
        runtimeClassName="nvidia", libCudaLogLevel="3", disableCoreLimit=True, operatingMode="mps",
    ).vendor("nvidia").settings  # fmt: skip
    assert (settings.device_split_count, settings.device_memory_scaling, settings.device_core_scaling) == (4, 1.5, 2)
    assert (settings.gpu_core_policy, settings.runtime_class_name, settings.lib_cuda_log_level) == (
        "force",
        "nvidia",
        "3",
    )
    assert settings.disable_core_limit
    assert settings.operating_mode == "mps"


# --------------------------------------------------------------------------------------------------------
# Admission defaults
# --------------------------------------------------------------------------------------------------------


def admit(
    resources: dict[str, str],
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    **config: object,
) -> AdmissionEdit | None:
    container = Container(name="c", limits=resources, env=env or {})
    pod = Pod(name="p", annotations=annotations or {}, containers=(container,))
    return plugins_with(**config).admission_defaults("NVIDIA", container, pod)


def test_a_count_alone_becomes_an_exclusive_gpu() -> None:
    edit = admit({GPU: "1"})
    assert edit is not None
    assert dict(edit.limits) == {CORES: "100"}
    edit = admit({GPU: "2", PCT: "100"})
    assert edit is not None
    assert dict(edit.limits) == {CORES: "100"}


@pytest.mark.parametrize(
    ("resources", "config"),
    [
        ({GPU: "1", MEM: "3000"}, {}),
        ({GPU: "1", PCT: "50"}, {}),
        ({GPU: "1", CORES: "20"}, {}),
        ({GPU: "1"}, {"defaultMemory": 2048}),
    ],
)
def test_a_share_is_not_made_exclusive(resources: dict[str, str], config: dict[str, object]) -> None:
    assert admit(resources, **config) is None


def test_memory_without_a_count_gets_the_default_count() -> None:
    edit = admit({MEM: "3000"})
    assert edit is not None
    assert dict(edit.limits) == {GPU: "1"}
    edit = admit({PCT: "100"}, defaultGPUNum=2)
    assert edit is not None
    assert dict(edit.limits) == {GPU: "2", CORES: "100"}


def test_priority_and_core_policy_become_env() -> None:
    edit = admit({GPU: "1", MEM: "1000", PRIORITY: "1"}, gpuCorePolicy="force")
    assert edit is not None
    assert dict(edit.env) == {"CUDA_TASK_PRIORITY": "1", "GPU_CORE_UTILIZATION_POLICY": "force"}
    assert admit({GPU: "1", MEM: "1000"}, gpuCorePolicy="default") is None


def test_runtime_class_is_set_when_configured() -> None:
    edit = admit({GPU: "1", MEM: "1000"}, runtimeClassName="nvidia")
    assert edit is not None
    assert edit.runtime_class_name == "nvidia"


def test_an_unknown_vgpu_mode_is_refused() -> None:
    edit = admit({GPU: "1", MEM: "1000"}, {"nvidia.com/vgpu-mode": "mig,vmware"})
    assert edit is not None
    assert edit.deny is not None
    assert "vmware is not a GPU mode; use one of hami-core, mig, mps" in edit.deny
    assert admit({GPU: "1", MEM: "1000"}, {"nvidia.com/vgpu-mode": "mig"}) is None


@pytest.mark.parametrize(
    "resources",
    [{GPU: "1", MEM: "3000"}, {GPU: "1", PCT: "50"}, {GPU: "1", CORES: "20"}, {GPU: "1", CORES: "100", MEM: "3000"}],
)
def test_a_share_that_turns_the_library_off_is_refused(resources: dict[str, str]) -> None:
    edit = admit(resources, env={"CUDA_DISABLE_CONTROL": "true"})
    assert edit is not None
    assert edit.deny is not None
    assert "CUDA_DISABLE_CONTROL=true runs it without the isolation library" in edit.deny
    assert f"{CORES}: 100 and the whole memory" in edit.deny


@pytest.mark.parametrize("resources", [{GPU: "1"}, {GPU: "2", PCT: "100"}, {GPU: "1", CORES: "100"}])
def test_whole_gpus_may_turn_the_library_off(resources: dict[str, str]) -> None:
    edit = admit(resources, env={"CUDA_DISABLE_CONTROL": "true"})
    assert edit is None or edit.deny is None


def test_admission_applied_twice_gives_the_same_pod() -> None:
    resources = {GPU: "1", PRIORITY: "0"}
    first = admit(resources, gpuCorePolicy="disable")
    assert first is not None
    applied = {**resources, **first.limits}
    second = admit(applied, env=dict(first.env), gpuCorePolicy="disable")
    assert second is None
