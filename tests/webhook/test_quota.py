"""Namespace quotas on device memory and cores: admission through the HTTPS webhook, and the filter-time
reservation that keeps two pods admitted at once from both taking the last of a quota."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scheduler_harness import Harness, gpu_node
from webhook_kit import Webhook, container, gpu, pod

from hami.model import ContainerDevice, Pod
from hami.quota import QuotaLedger, parse_quantity
from hami.webhook.certs import CertBundle

NS = "team"
GPUMEM = "limits.nvidia.com/gpumem"
GPUCORES = "limits.nvidia.com/gpucores"


def placed(*devices: tuple[str, int, int], kind: str = "NVIDIA") -> str:
    """A one-container `…-devices-allocated` value."""
    return "".join(f"{uuid},{kind},{mem},{cores}:" for uuid, mem, cores in devices) + ";"


def running(name: str, *containers: dict[str, Any], allocated: str | None = None, **kw: Any) -> dict[str, Any]:
    annotations = {"hami.io/vgpu-devices-allocated": allocated} if allocated else None
    return pod(
        *containers,
        name=name,
        namespace=NS,
        scheduler="hami-scheduler",
        node=kw.pop("node", "n1"),
        phase=kw.pop("phase", "Running"),
        annotations=annotations,
        **kw,
    )


# ------------------------------------------------------------------------------------------------ memory


def test_multi_device_pod_is_denied_with_used_and_asked_figures(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    webhook.running_pod(
        running("old", container("c0", gpu(2, 3000)), allocated=placed(("GPU-A", 3000, 0), ("GPU-B", 3000, 0)))
    )
    result = webhook.admit(pod(container("c0", gpu(2, 3000)), name="new", namespace=NS))
    assert not result.allowed
    assert result.code == 403
    message = result.message
    assert f"exceeds ResourceQuota {NS}/gpu-quota: {GPUMEM} is 10000 MiB" in message
    assert "already use 6000 MiB and this pod asks 6000 MiB (c0: 2 × 3000 MiB), 12000 MiB in all, 4000 MiB free" in (
        message
    )


def test_bound_pod_without_allocation_counts_by_its_requests_times_count(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    webhook.running_pod(running("old", container("c0", gpu(2, 3000))))
    assert webhook.ledger.used(NS) == {GPUMEM: 6000, GPUCORES: 0}
    assert not webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS)).allowed
    assert webhook.admit(pod(container("c0", gpu(2, 2000)), namespace=NS)).allowed  # exactly 10000


def test_a_placed_pod_also_counts_the_requests_of_kinds_its_allocation_does_not_name(webhook: Webhook) -> None:
    """The ledger reads a placed pod's requests only for kinds beyond its allocation: those still count."""
    mlu = "limits.cambricon.com/mlu.smlu.vmemory"
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000", mlu: "40"})
    both = container("c0", {**gpu(1, 3000), "cambricon.com/vmlu": "1", "cambricon.com/mlu.smlu.vmemory": "20"})
    webhook.running_pod(running("old", both, allocated=placed(("GPU-A", 4000, 0))))
    used = webhook.ledger.used(NS)
    assert used[GPUMEM] == 4000  # the placement, not the request of 3000
    assert used[mlu] == 5120  # 20 × 256 MiB, from the request: nothing placed it
    webhook.running_pod(running("gpu-only", container("c0", gpu(1, 3000)), allocated=placed(("GPU-B", 2000, 0))))
    assert webhook.ledger.used(NS)[GPUMEM] == 6000


def test_pod_that_fits_exactly_is_admitted(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10k"})
    webhook.running_pod(
        running("old", container("c0", gpu(2, 3000)), allocated=placed(("GPU-A", 3000, 0), ("GPU-B", 3000, 0)))
    )
    result = webhook.admit(pod(container("a", gpu(1, 2000)), container("b", gpu(1, 2000)), namespace=NS))
    assert result.allowed, result.message


def test_multi_container_demand_is_summed_over_app_containers(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    result = webhook.admit(pod(container("a", gpu(2, 3000)), container("b", gpu(3, 1500)), namespace=NS))
    assert not result.allowed
    assert "this pod asks 10500 MiB (a: 2 × 3000 MiB; b: 3 × 1500 MiB)" in result.message


def test_init_container_counts_as_its_peak_not_added_to_the_app_containers(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    obj = pod(container("app", gpu(1, 2000)), init=[container("warmup", gpu(1, 8000))], namespace=NS)
    assert webhook.admit(obj).allowed  # HAMi counts 8000 + 2000 here; the pod never holds both
    webhook.running_pod(running("old", container("c0", gpu(1, 3000))))
    result = webhook.admit(obj)
    assert not result.allowed
    assert "asks 8000 MiB (warmup: 1 × 8000 MiB (init container, its peak))" in result.message


def test_running_pod_with_init_container_counts_per_device_peak(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    allocated = placed(("GPU-A", 8000, 0)) + placed(("GPU-A", 2000, 0))  # init then app, on the same device
    obj = running("old", container("app", gpu(1, 2000)), init=[container("warmup", gpu(1, 8000))], allocated=allocated)
    webhook.running_pod(obj)
    assert webhook.ledger.used(NS)[GPUMEM] == 8000


def test_memory_quota_in_the_resources_unit_is_multiplied_out(webhook: Webhook) -> None:
    webhook.add_quota("mlu-quota", NS, {"limits.cambricon.com/mlu.smlu.vmemory": "40"})  # 40 × 256 MiB
    ok = pod(container("c0", {"cambricon.com/vmlu": "2", "cambricon.com/mlu.smlu.vmemory": "20"}), namespace=NS)
    assert webhook.admit(ok).allowed  # 2 × 5120 MiB = 10240 MiB
    big = pod(container("c0", {"cambricon.com/vmlu": "3", "cambricon.com/mlu.smlu.vmemory": "20"}), namespace=NS)
    result = webhook.admit(big)
    assert not result.allowed
    assert "is 40 (× 256 MiB = 10240 MiB)" in result.message
    assert "asks 15360 MiB" in result.message


def test_ascend_memory_quota(webhook: Webhook) -> None:
    key = "huawei.com/Ascend910B3"
    webhook.add_quota("npu-quota", NS, {f"limits.{key}-memory": "16384"})
    webhook.running_pod(running("old", container("c0", {key: "1", f"{key}-memory": "8192"})))
    result = webhook.admit(pod(container("c0", {key: "1", f"{key}-memory": "16384"}), namespace=NS))
    assert not result.allowed
    assert "already use 8192 MiB and this pod asks 16384 MiB" in result.message


# ------------------------------------------------------------------------------------------------ cores


def test_cores_quota_counts_per_device_cores_times_count(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUCORES: "100"})
    webhook.running_pod(
        running("old", container("c0", gpu(2, 1000, 30)), allocated=placed(("GPU-A", 1000, 30), ("GPU-B", 1000, 30)))
    )
    result = webhook.admit(pod(container("c0", gpu(2, 1000, 30)), namespace=NS))
    assert not result.allowed
    assert f"{GPUCORES} is 100%; the namespace's pods already use 60% and this pod asks 60% (c0: 2 × 30%)" in (
        result.message
    )
    assert webhook.admit(pod(container("c0", gpu(2, 1000, 20)), namespace=NS)).allowed


def test_whole_card_request_counts_full_cores_per_device(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUCORES: "150", GPUMEM: "20000"})
    result = webhook.admit(pod(container("c0", gpu(2, mem=None)), namespace=NS))
    assert not result.allowed
    assert "asks 200%" in result.message


# ------------------------------------------------------------------------------------------------ what counts


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_do_not_count(webhook: Webhook, phase: str) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "6000"})
    webhook.running_pod(running("done", container("c0", gpu(2, 3000)), phase=phase))
    assert webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS)).allowed


def test_pending_unplaced_pods_do_not_count(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "6000"})
    webhook.running_pod(running("waiting", container("c0", gpu(2, 3000)), node=None, phase="Pending"))
    assert webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS)).allowed


def test_deleted_pod_frees_its_quota(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "6000"})
    webhook.running_pod(running("old", container("c0", gpu(2, 3000))))
    assert not webhook.admit(pod(container("c0", gpu(1, 1000)), namespace=NS)).allowed
    webhook.cluster.delete("pods", "old", NS)
    webhook.cluster.flush()
    assert webhook.admit(pod(container("c0", gpu(1, 1000)), namespace=NS)).allowed


def test_quota_of_another_namespace_does_not_apply(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", "other", {GPUMEM: "1000"})
    assert webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS)).allowed


def test_every_quota_object_is_enforced_and_the_tighter_one_is_named(webhook: Webhook) -> None:
    webhook.add_quota("loose", NS, {GPUMEM: "100000"})
    webhook.add_quota("tight", NS, {GPUMEM: "5000", "limits.cpu": "4"})
    result = webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS))
    assert not result.allowed
    assert f"ResourceQuota {NS}/tight" in result.message


def test_quota_changes_and_deletions_are_seen_through_the_watch(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "1000"})
    assert not webhook.admit(pod(container("c0", gpu(1, 3000)), namespace=NS)).allowed
    quota = webhook.cluster.get("resourcequotas", "gpu-quota", NS)
    quota["spec"]["hard"][GPUMEM] = "4000"
    webhook.cluster.replace("resourcequotas", quota)
    webhook.cluster.flush()
    assert webhook.admit(pod(container("c0", gpu(1, 3000)), namespace=NS)).allowed
    assert not webhook.admit(pod(container("c0", gpu(1, 5000)), namespace=NS)).allowed
    webhook.cluster.delete("resourcequotas", "gpu-quota", NS)
    webhook.cluster.flush()
    assert webhook.admit(pod(container("c0", gpu(1, 5000)), namespace=NS)).allowed


def test_quota_value_that_is_not_a_quantity_is_ignored(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "lots"})
    assert webhook.ledger.limits(NS) == {}
    assert webhook.admit(pod(container("c0", gpu(1, 3000)), namespace=NS)).allowed


@pytest.mark.parametrize(
    ("text", "value"),
    [("10000", 10000), ("10k", 10000), ("1Ki", 1024), ("1.5k", 1500), ("500m", 1), ("1e3", 1000), ("0", 0)],
)
def test_quantities_read_like_kubernetes(text: str, value: int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "-1", "ten", "1KB", "1e999999999", "9" * 100])
def test_bad_quantities_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


# ------------------------------------------------------------------------------------------------ filter time


def two_gpus(node: str, mem: int) -> dict[str, tuple[tuple[ContainerDevice, ...], ...]]:
    devices = tuple(ContainerDevice(uuid=f"GPU-{node}-{i}", type="NVIDIA", usedmem=mem, usedcores=0) for i in range(2))
    return {"NVIDIA": (devices,)}


def test_two_pods_admitted_at_once_cannot_both_be_placed(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    a = pod(container("c0", gpu(2, 3000)), name="a", namespace=NS)
    b = pod(container("c0", gpu(2, 3000)), name="b", namespace=NS)
    assert webhook.admit(a).allowed
    assert webhook.admit(b).allowed
    ledger = webhook.ledger
    first = ledger.reserve(Pod.from_api(a), two_gpus("n1", 3000))
    second = ledger.reserve(Pod.from_api(b), two_gpus("n2", 3000))
    assert first.fits
    assert not second.fits
    assert (second.used, second.asked, second.limit) == (6000, 6000, 10000)
    assert "this pod asks 6000 MiB (2 device(s) placed: 3000 MiB + 3000 MiB)" in second.reason


def test_reservation_survives_a_stale_watch_event_and_is_replaced_by_the_placement(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
    a = webhook.running_pod(pod(container("c0", gpu(2, 3000)), name="a", namespace=NS, phase="Pending"))
    ledger = webhook.ledger
    assert ledger.reserve(Pod.from_api(a), two_gpus("n1", 3000)).fits
    webhook.cluster.patch_metadata("pods", "a", NS, labels={"x": "y"})  # an event from before the placement
    webhook.cluster.flush()
    assert ledger.used(NS)[GPUMEM] == 6000
    allocated = placed(("GPU-n1-0", 3000, 0), ("GPU-n1-1", 3000, 0))
    webhook.cluster.patch_metadata(
        "pods", "a", NS, annotations={"hami.io/vgpu-devices-allocated": allocated, "hami.io/vgpu-node": "n1"}
    )
    webhook.cluster.flush()
    assert ledger.used(NS)[GPUMEM] == 6000
    ledger.release(NS, "a")
    assert ledger.used(NS) == {}


def test_released_reservation_frees_the_quota(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "6000"})
    a = Pod.from_api(pod(container("c0", gpu(2, 3000)), name="a", namespace=NS))
    b = Pod.from_api(pod(container("c0", gpu(2, 3000)), name="b", namespace=NS))
    assert webhook.ledger.reserve(a, two_gpus("n1", 3000)).fits
    assert not webhook.ledger.reserve(b, two_gpus("n1", 3000)).fits
    webhook.ledger.release(NS, "a")  # the filter could not record a's placement
    assert webhook.ledger.reserve(b, two_gpus("n1", 3000)).fits


def test_refiltering_a_pod_does_not_count_it_twice(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "6000"})
    a = Pod.from_api(pod(container("c0", gpu(2, 3000)), name="a", namespace=NS))
    assert webhook.ledger.reserve(a, two_gpus("n1", 3000)).fits
    assert webhook.ledger.reserve(a, two_gpus("n2", 3000)).fits


def test_pods_placed_by_the_real_scheduler_count_against_admission(tls_dir: Path, tls_bundle: CertBundle) -> None:
    harness = Harness().start()
    webhook = Webhook(tls_dir, tls_bundle, cluster=harness.cluster).start()
    try:
        harness.add_node(gpu_node("n1", gpus=4, memory=16384))
        webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000"})
        first = pod(container("c0", gpu(2, 3000)), name="first", namespace=NS, scheduler="hami-scheduler")
        second = pod(container("c0", gpu(2, 3000)), name="second", namespace=NS, scheduler="hami-scheduler")
        assert webhook.admit(first).allowed
        assert webhook.admit(second).allowed
        harness.add_pod(first)
        harness.add_pod(second)
        harness.flush()
        assert harness.schedule("first", namespace=NS) == "n1"
        harness.flush()
        assert webhook.ledger.used(NS)[GPUMEM] == 6000  # from the allocation the extender wrote
        live = harness.cluster.get("pods", "second", NS)
        verdict = webhook.ledger.reserve(Pod.from_api(live), two_gpus("n1", 3000))
        assert not verdict.fits
        assert "already use 6000 MiB" in verdict.reason
        third = webhook.admit(pod(container("c0", gpu(2, 3000)), name="third", namespace=NS))
        assert not third.allowed
        assert "already use 6000 MiB" in third.message
    finally:
        webhook.stop()
        harness.stop()


def test_ledger_start_reads_what_already_exists(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "10000", GPUCORES: "200"})
    webhook.running_pod(running("old", container("c0", gpu(2, 3000, 10))))
    fresh = QuotaLedger(webhook.cluster, webhook.plugins).start()
    try:
        assert fresh.ready
        assert fresh.limits(NS) == {"gpu-quota": {GPUMEM: 10000, GPUCORES: 200}}
        assert fresh.used(NS) == {GPUMEM: 6000, GPUCORES: 20}
    finally:
        fresh.stop()


def test_quota_written_with_a_suffix_is_shown_with_its_value(webhook: Webhook) -> None:
    webhook.add_quota("gpu-quota", NS, {GPUMEM: "5k"})
    result = webhook.admit(pod(container("c0", gpu(2, 3000)), namespace=NS))
    assert not result.allowed
    assert f"{GPUMEM} is 5k (= 5000 MiB)" in result.message
