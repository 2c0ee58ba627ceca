"""The data model: validation with actionable messages, and the pod view built from Kubernetes JSON."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hami.model import (
    AnnotationKeys,
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    Pod,
    PodAllocation,
    RegisterFormat,
    ResourceNames,
    VendorInfo,
)


def _kind(word: str = "NVIDIA") -> DeviceKind:
    return DeviceKind(
        common_word=word,
        resources=ResourceNames(count="nvidia.com/gpu", memory="nvidia.com/gpumem", cores="nvidia.com/gpucores"),
        annotations=AnnotationKeys(
            node_register="hami.io/node-nvidia-register",
            to_allocate="hami.io/vgpu-devices-to-allocate",
            allocated="hami.io/vgpu-devices-allocated",
        ),
    )


# --------------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------------


def test_device_negative_memory_is_rejected_naming_the_field() -> None:
    with pytest.raises(ValidationError) as info:
        Device(id="GPU-0", devmem=-1)
    assert "devmem" in str(info.value)
    assert "greater than or equal to 0" in str(info.value)


@pytest.mark.parametrize("field", ["count", "devcore", "index"])
def test_device_negative_counts_are_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Device(id="GPU-0", **{field: -1})


def test_device_numa_minus_one_means_unknown_but_lower_is_rejected() -> None:
    assert Device(id="GPU-0", numa=-1).numa == -1
    with pytest.raises(ValidationError, match="numa"):
        Device(id="GPU-0", numa=-2)


def test_container_request_negative_memory_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        ContainerRequest(kind="NVIDIA", count=1, memory=-1024)
    assert "memory" in str(info.value)
    assert "greater than or equal to 0" in str(info.value)


def test_container_request_cores_over_100_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        ContainerRequest(kind="NVIDIA", count=1, cores=101)
    assert "cores" in str(info.value)
    assert "less than or equal to 100" in str(info.value)


def test_container_request_memory_percentage_over_100_is_rejected() -> None:
    with pytest.raises(ValidationError, match="memory_percentage"):
        ContainerRequest(kind="NVIDIA", count=1, memory_percentage=150)


def test_container_request_count_zero_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        ContainerRequest(kind="NVIDIA", count=0)
    assert "count" in str(info.value)
    assert "greater than or equal to 1" in str(info.value)


def test_container_request_absurd_count_is_rejected() -> None:
    with pytest.raises(ValidationError, match="count"):
        ContainerRequest(kind="NVIDIA", count=100_000)


def test_container_request_memory_and_percentage_together_are_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        ContainerRequest(kind="NVIDIA", count=1, memory=4096, memory_percentage=50)
    assert "ask for memory in MiB or as a percentage of the device, not both" in str(info.value)


def test_container_request_needs_a_kind() -> None:
    with pytest.raises(ValidationError, match="kind"):
        ContainerRequest(kind="", count=1)


@pytest.mark.parametrize("separator", [",", ":", ";"])
def test_device_id_with_an_encoding_separator_is_rejected(separator: str) -> None:
    with pytest.raises(ValidationError) as info:
        Device(id=f"GPU{separator}0")
    message = str(info.value)
    assert f"'GPU{separator}0'" in message
    assert f"contains '{separator}'" in message
    assert "separators" in message
    assert "use the device UUID as the driver reports it" in message


@pytest.mark.parametrize("separator", [",", ":", ";"])
def test_container_device_uuid_and_type_with_a_separator_are_rejected(separator: str) -> None:
    with pytest.raises(ValidationError, match="separators"):
        ContainerDevice(uuid=f"GPU-A{separator}", type="NVIDIA")
    with pytest.raises(ValidationError, match="separators"):
        ContainerDevice(uuid="GPU-A", type=f"NVI{separator}DIA")


def test_device_id_lists_every_separator_it_contains() -> None:
    with pytest.raises(ValidationError) as info:
        Device(id="a,b;c")
    assert "contains ',' ';'" in str(info.value)


@pytest.mark.parametrize("field", ["type", "mode"])
def test_device_type_and_mode_with_a_separator_are_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match="a separator of HAMi's encodings"):
        Device(id="GPU-0", **{field: "A100:80GB"})


def test_empty_device_id_is_rejected() -> None:
    with pytest.raises(ValidationError, match="device id must not be empty"):
        Device(id="")


def test_empty_container_device_uuid_is_rejected() -> None:
    with pytest.raises(ValidationError, match="must not be empty"):
        ContainerDevice(uuid="", type="NVIDIA")


def test_container_device_negative_usage_is_rejected() -> None:
    with pytest.raises(ValidationError, match="usedmem"):
        ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=-1)
    with pytest.raises(ValidationError, match="usedcores"):
        ContainerDevice(uuid="GPU-A", type="NVIDIA", usedcores=-1)


def test_pod_allocation_with_wrong_number_of_container_entries_is_rejected() -> None:
    gpu = ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=1024, usedcores=10)
    with pytest.raises(ValidationError) as info:
        PodAllocation(containers=3, by_kind={"NVIDIA": ((gpu,), ())})
    assert "allocation for 'NVIDIA' has 2 container entries, the pod has 3" in str(info.value)


def test_pod_allocation_with_one_entry_per_container_is_accepted() -> None:
    gpu = ContainerDevice(uuid="GPU-A", type="NVIDIA", usedmem=1024, usedcores=10)
    allocation = PodAllocation(containers=2, by_kind={"NVIDIA": ((), (gpu,)), "DCU": ((), ())})
    assert allocation.by_kind["NVIDIA"][1] == (gpu,)


def test_node_fit_with_neither_placement_nor_reason_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        NodeFit(node="node-1")
    assert "node 'node-1' does not fit but no reason was given" in str(info.value)


def test_node_fit_with_a_placement_fits_and_with_a_reason_does_not() -> None:
    assert NodeFit(node="node-1", placement=((),)).fits is True
    refused = NodeFit(node="node-2", reason="no GPU has 8000 MiB free")
    assert refused.fits is False
    assert refused.reason == "no GPU has 8000 MiB free"


def test_vendor_with_duplicate_kinds_is_rejected() -> None:
    with pytest.raises(ValidationError) as info:
        VendorInfo(name="nvidia", display_name="NVIDIA", kinds=(_kind(), _kind()))
    assert "vendor 'nvidia' declares a device kind twice: ['NVIDIA', 'NVIDIA']" in str(info.value)


def test_vendor_without_kinds_is_rejected() -> None:
    with pytest.raises(ValidationError, match="kinds"):
        VendorInfo(name="nvidia", display_name="NVIDIA", kinds=())


def test_vendor_name_must_be_a_short_lowercase_name() -> None:
    with pytest.raises(ValidationError, match="name"):
        VendorInfo(name="NVIDIA Corp", display_name="NVIDIA", kinds=(_kind(),))


def test_vendor_kind_lookup_names_the_missing_kind() -> None:
    vendor = VendorInfo(name="nvidia", display_name="NVIDIA", kinds=(_kind(),))
    assert vendor.kind("NVIDIA").common_word == "NVIDIA"
    with pytest.raises(KeyError, match="vendor 'nvidia' has no device kind 'DCU'"):
        vendor.kind("DCU")


def test_device_kind_common_word_must_be_one_word() -> None:
    with pytest.raises(ValidationError, match="common_word"):
        _kind("Ascend 910")
    assert _kind("Ascend910B4-1").common_word == "Ascend910B4-1"


def test_device_kind_defaults_to_json_register() -> None:
    assert _kind().register_format is RegisterFormat.JSON


def test_resource_names_memory_unit_must_be_positive() -> None:
    with pytest.raises(ValidationError, match="memory_unit_mib"):
        ResourceNames(count="cambricon.com/vmlu", memory_unit_mib=0)


def test_models_reject_unknown_fields_so_typos_surface() -> None:
    with pytest.raises(ValidationError, match="devmemory"):
        Device(id="GPU-0", devmemory=1024)  # type: ignore[call-arg]


def test_models_are_frozen() -> None:
    device = Device(id="GPU-0")
    with pytest.raises(ValidationError):
        device.devmem = 1  # type: ignore[misc]


def test_device_defaults_describe_a_whole_healthy_device() -> None:
    device = Device(id="GPU-0")
    assert (device.count, device.devcore, device.health, device.numa) == (1, 100, True, 0)


# --------------------------------------------------------------------------------------------------------
# Small behaviours
# --------------------------------------------------------------------------------------------------------


def test_resource_names_all_lists_count_first_and_skips_unset() -> None:
    names = ResourceNames(
        count="nvidia.com/gpu",
        memory="nvidia.com/gpumem",
        memory_percentage="nvidia.com/gpumem-percentage",
        cores="nvidia.com/gpucores",
        priority="nvidia.com/priority",
    )
    assert names.all() == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    )
    assert ResourceNames(count="metax-tech.com/gpu").all() == ("metax-tech.com/gpu",)


def test_annotation_keys_selectors_skip_unset() -> None:
    keys = AnnotationKeys(
        to_allocate="hami.io/dcu-devices-to-allocate",
        allocated="hami.io/dcu-devices-allocated",
        use_uuid="hygon.com/use-gpuuuid",
        nouse_type="hygon.com/nouse-dcutype",
    )
    assert keys.selectors() == ("hygon.com/use-gpuuuid", "hygon.com/nouse-dcutype")


def test_device_usage_reports_what_is_free() -> None:
    usage = DeviceUsage(
        device=Device(id="GPU-0", count=10, devmem=8192, devcore=100), used=3, usedmem=3000, usedcores=30
    )
    assert (usage.id, usage.free_slots, usage.free_memory, usage.free_cores) == ("GPU-0", 7, 5192, 70)


def test_device_usage_is_mutable_for_the_scheduler() -> None:
    usage = DeviceUsage(device=Device(id="GPU-0", devmem=8192))
    usage.usedmem += 1024
    assert usage.free_memory == 7168


def test_memory_on_resolves_a_percentage_against_the_device() -> None:
    request = ContainerRequest(kind="NVIDIA", count=1, memory_percentage=50)
    assert request.memory_on(Device(id="GPU-0", devmem=8192)) == 4096
    assert request.memory_on(Device(id="GPU-1", devmem=40960)) == 20480


def test_memory_on_rounds_a_percentage_down_to_whole_mib() -> None:
    assert ContainerRequest(kind="NVIDIA", count=1, memory_percentage=33).memory_on(Device(id="G", devmem=1000)) == 330


def test_memory_on_whole_device_is_all_its_memory() -> None:
    request = ContainerRequest(kind="NVIDIA", count=1, memory_percentage=100, cores=100)
    assert request.memory_on(Device(id="GPU-0", devmem=24576)) == 24576


def test_memory_on_fixed_memory_ignores_the_device_size() -> None:
    request = ContainerRequest(kind="NVIDIA", count=2, memory=3000)
    assert request.memory_on(Device(id="GPU-0", devmem=8192)) == 3000
    assert request.memory_on(Device(id="GPU-1", devmem=81920)) == 3000


def test_memory_on_without_memory_asked_is_zero() -> None:
    assert ContainerRequest(kind="NVIDIA", count=1, cores=20).memory_on(Device(id="GPU-0", devmem=8192)) == 0


def test_container_resource_reads_limits_first() -> None:
    container = Container(name="app", limits={"nvidia.com/gpu": "2"}, requests={"nvidia.com/gpu": "1"})
    assert container.resource("nvidia.com/gpu") == "2"


def test_container_resource_falls_back_from_limits_to_requests() -> None:
    container = Container(name="app", limits={"nvidia.com/gpu": "1"}, requests={"nvidia.com/gpumem": "4096"})
    assert container.resource("nvidia.com/gpumem") == "4096"


def test_container_resource_absent_everywhere_is_none() -> None:
    assert Container(name="app").resource("nvidia.com/gpu") is None


def test_container_mentions_a_resource_in_limits_or_requests() -> None:
    container = Container(name="app", requests={"nvidia.com/gpucores": "30"})
    assert container.mentions(["nvidia.com/gpu", "nvidia.com/gpucores"])
    assert not container.mentions(["hygon.com/dcunum"])


# --------------------------------------------------------------------------------------------------------
# Pod.from_api
# --------------------------------------------------------------------------------------------------------

POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "trainer-0",
        "namespace": "ml-team",
        "uid": "6f1c2b7e-0d4a-4f3e-9c1b-2a3d4e5f6a7b",
        "labels": {"app": "trainer", "hami.io/vgpu-node": "node-1"},
        "annotations": {
            "nvidia.com/use-gputype": "A100,H100",
            "hami.io/vgpu-devices-allocated": ";GPU-A,NVIDIA,8000,30:;",
        },
        "creationTimestamp": "2025-01-02T03:04:05Z",
    },
    "spec": {
        "schedulerName": "hami-scheduler",
        "nodeName": "node-1",
        "initContainers": [
            {
                "name": "fetch-weights",
                "image": "busybox:1.36",
                "resources": {},
                "env": [{"name": "BUCKET", "value": "s3://weights"}],
            }
        ],
        "containers": [
            {
                "name": "trainer",
                "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
                "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000", "cpu": "4", "memory": "16Gi"},
                    "requests": {"nvidia.com/gpucores": "30", "cpu": "2"},
                },
                "env": [
                    {"name": "CUDA_TASK_PRIORITY", "value": "1"},
                    {"name": "EMPTY"},
                    {"name": "NULL_VALUE", "value": None},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                ],
                "securityContext": {"privileged": False, "runAsUser": 1000},
            },
            {
                "name": "debug-sidecar",
                "image": "nicolaka/netshoot",
                "securityContext": {"privileged": True},
            },
        ],
    },
    "status": {"phase": "Pending"},
}


def test_pod_from_api_reads_identity_and_scheduling_fields() -> None:
    pod = Pod.from_api(POD)
    assert (pod.name, pod.namespace, pod.uid) == ("trainer-0", "ml-team", "6f1c2b7e-0d4a-4f3e-9c1b-2a3d4e5f6a7b")
    assert pod.node_name == "node-1"
    assert pod.scheduler_name == "hami-scheduler"
    assert pod.annotations["hami.io/vgpu-devices-allocated"] == ";GPU-A,NVIDIA,8000,30:;"
    assert pod.labels == {"app": "trainer", "hami.io/vgpu-node": "node-1"}


def test_pod_from_api_puts_init_containers_first() -> None:
    pod = Pod.from_api(POD)
    assert [c.name for c in pod.all_containers] == ["fetch-weights", "trainer", "debug-sidecar"]
    assert [c.name for c in pod.init_containers] == ["fetch-weights"]
    assert [c.name for c in pod.containers] == ["trainer", "debug-sidecar"]


def test_pod_from_api_reads_limits_and_requests() -> None:
    trainer = Pod.from_api(POD).containers[0]
    assert trainer.limits["nvidia.com/gpumem"] == "8000"
    assert trainer.requests["nvidia.com/gpucores"] == "30"
    assert trainer.resource("nvidia.com/gpu") == "1"
    assert trainer.resource("nvidia.com/gpucores") == "30"
    assert trainer.resource("cpu") == "4"


def test_pod_from_api_keeps_literal_env_values_only() -> None:
    trainer = Pod.from_api(POD).containers[0]
    assert trainer.env == {"CUDA_TASK_PRIORITY": "1", "EMPTY": "", "NULL_VALUE": ""}


def test_pod_from_api_reads_the_privileged_flag() -> None:
    pod = Pod.from_api(POD)
    assert [c.privileged for c in pod.all_containers] == [False, False, True]


def test_pod_from_api_turns_numeric_quantities_into_strings() -> None:
    pod = Pod.from_api(
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]},
        }
    )
    assert pod.containers[0].resource("nvidia.com/gpu") == "2"


def test_pod_from_api_fills_defaults_for_a_minimal_object() -> None:
    pod = Pod.from_api({"metadata": {"generateName": "job-"}, "spec": {"containers": [{"name": "c"}]}})
    assert (pod.name, pod.namespace, pod.uid, pod.node_name) == ("job-", "default", "", "")
    assert pod.init_containers == ()
    assert pod.containers[0] == Container(name="c")


def test_pod_from_api_tolerates_nulls_where_the_api_omits_fields() -> None:
    pod = Pod.from_api(
        {
            "metadata": {"name": "p", "annotations": None, "labels": None},
            "spec": {"initContainers": None, "containers": [{"name": "c", "resources": None, "env": None}]},
        }
    )
    assert pod.annotations == {}
    assert pod.all_containers == (Container(name="c"),)
