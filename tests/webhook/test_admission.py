"""The admission flow of protocol.md section 5, branch by branch, through the real HTTPS server."""

from __future__ import annotations

from pathlib import Path

import pytest
from webhook_kit import DENY_ANNOTATION, Webhook, container, gpu, pod, review

from hami.webhook.certs import CertBundle

ASCEND = "huawei.com/Ascend910B3"
MLU = "cambricon.com/vmlu"
DCU = "hygon.com/dcunum"


# ------------------------------------------------------------------------------------------------ scheduler


def test_gpu_pod_goes_to_hami_scheduler_with_a_one_operation_patch(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu(1, 3000))))
    assert result.allowed
    assert result.patch == [{"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}]
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"
    assert "NVIDIA" in result.message
    assert "c0 1 × (3000 MiB" in result.message
    assert "spec.schedulerName=hami-scheduler (was 'default-scheduler')" in result.message


def test_pod_without_scheduler_name_gets_it_added(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), scheduler=None))
    assert result.patch == [{"op": "add", "path": "/spec/schedulerName", "value": "hami-scheduler"}]


def test_pod_already_naming_this_scheduler_needs_no_patch(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), scheduler="hami-scheduler"))
    assert result.allowed
    assert result.patch == []
    assert "nothing to change" in result.message


def test_pod_naming_another_scheduler_is_left_alone(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu(), privileged=True), scheduler="volcano"))
    assert result.allowed
    assert result.patch == []
    assert "names scheduler 'volcano'" in result.message


def test_configured_scheduler_name_is_used(tls_dir: Path, tls_bundle: CertBundle) -> None:
    webhook = Webhook(tls_dir, tls_bundle).start(schedulerName="gpu-scheduler")
    try:
        assert webhook.admit(pod(container("c0", gpu()))).pod["spec"]["schedulerName"] == "gpu-scheduler"
        left = webhook.admit(pod(container("c0", gpu()), scheduler="hami-scheduler"))
        assert left.patch == []
        assert "names scheduler 'hami-scheduler'" in left.message
    finally:
        webhook.stop()


def test_default_scheduler_is_kept_when_overwriting_is_off(tls_dir: Path, tls_bundle: CertBundle) -> None:
    webhook = Webhook(tls_dir, tls_bundle).start(overwriteDefaultScheduler=False)
    try:
        result = webhook.admit(pod(container("c0", gpu())))
        assert result.allowed
        assert result.patch == []
        assert "names scheduler 'default-scheduler'" in result.message
    finally:
        webhook.stop()


def test_pod_without_shared_devices_is_left_alone(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("web", {"cpu": "1", "memory": "1Gi"}), node="n1"))
    assert result.allowed
    assert result.patch == []
    assert "asks for no shared device" in result.message


def test_v1beta1_review_is_answered_in_v1beta1(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu())), api_version="admission.k8s.io/v1beta1")
    assert result.answer["apiVersion"] == "admission.k8s.io/v1beta1"
    assert result.allowed
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"


def test_review_namespace_wins_over_an_empty_pod_namespace(webhook: Webhook) -> None:
    obj = pod(container("c0", gpu()))
    del obj["metadata"]["namespace"]
    result = webhook.admit(obj, namespace="team-a")
    assert "pod team-a/p" in result.message


# ------------------------------------------------------------------------------------------------ denials


def test_pod_without_containers_is_denied(webhook: Webhook) -> None:
    result = webhook.admit(pod())
    assert not result.allowed
    assert result.code == 400
    assert "has no containers" in result.message


def test_privileged_container_with_a_gpu_is_denied_naming_it(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("side", {}), container("trainer", gpu(), privileged=True)))
    assert not result.allowed
    assert result.code == 403
    assert "container trainer is privileged and the pod asks for NVIDIA devices" in result.message


def test_privileged_init_container_with_a_device_is_denied(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), init=[container("setup", {ASCEND: "1"}, privileged=True)]))
    assert not result.allowed
    assert "container setup is privileged and the pod asks for Ascend910B3, NVIDIA devices" in result.message


def test_a_privileged_container_without_devices_denies_the_whole_pod_that_asks_for_shared_devices(
    webhook: Webhook,
) -> None:
    """HAMi denies the pod, not only a privileged container with devices: the tenant's privileged sidecar sees
    every GPU of the node, the shared ones its neighbours use included."""
    result = webhook.admit(pod(container("c0", gpu()), container("netadmin", {}, privileged=True)))
    assert not result.allowed
    assert result.code == 403
    assert "container netadmin is privileged and the pod asks for NVIDIA devices" in result.message
    # a privileged init container beside app containers with GPUs: the same
    result = webhook.admit(pod(container("c0", gpu()), init=[container("chown", {}, privileged=True)]))
    assert not result.allowed
    assert "container chown is privileged" in result.message


def test_a_privileged_pod_without_shared_devices_is_left_alone(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("netadmin", {"cpu": "1"}, privileged=True)))
    assert result.allowed
    assert "asks for no shared device" in result.message


# ------------------------------------------------------------------------------------------------ warnings


def test_cores_over_100_are_read_as_100_with_a_warning(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu(1, 3000, cores=150))))
    assert result.allowed
    assert result.answer["response"]["warnings"] == [
        "container c0: nvidia.com/gpucores: 150 is more than 100 percent; read as 100 (the whole device's compute)"
    ]
    assert "c0 1 × (3000 MiB, 100% cores)" in result.message


def test_memory_percentage_beside_absolute_memory_is_ignored_with_a_warning(webhook: Webhook) -> None:
    limits = {**gpu(1, 3000), "nvidia.com/gpumem-percentage": "50"}
    result = webhook.admit(pod(container("c0", limits)))
    assert result.allowed
    assert result.answer["response"]["warnings"] == [
        "container c0: nvidia.com/gpumem-percentage: 50 is ignored because nvidia.com/gpumem is given (3000)"
    ]
    assert "c0 1 × (3000 MiB" in result.message


def test_a_zero_memory_percentage_counts_as_not_given_with_a_warning(webhook: Webhook) -> None:
    limits = {**gpu(1, mem=None), "nvidia.com/gpumem-percentage": "0"}
    result = webhook.admit(pod(container("c0", limits)))
    assert result.allowed
    assert result.answer["response"]["warnings"] == [
        "container c0: nvidia.com/gpumem-percentage: 0 is read as not given"
    ]
    assert "c0 1 × (100% memory, 100% cores)" in result.message


def test_a_pod_taken_as_written_carries_no_warnings(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu(1, 3000, cores=30))))
    assert "warnings" not in result.answer["response"]


def test_a_misspelt_vendor_resource_is_admitted_with_a_warning_naming_the_nearest_one(webhook: Webhook) -> None:
    # nvidia.com/gpumemm is read by nobody: without the warning the pod silently got a whole GPU.
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumemm": "3000"}
    result = webhook.admit(pod(container("c0", limits)))
    assert result.allowed
    assert result.answer["response"]["warnings"] == [
        "container c0: no hami vendor plugin reads nvidia.com/gpumemm; did you mean nvidia.com/gpumem? "
        "(ignore this if another device plugin serves it)"
    ]
    # the only device resource misspelt: left alone, and still told why
    result = webhook.admit(pod(container("c0", {"nvidia.com/gpus": "1"})))
    assert "asks for no shared device" in result.message
    assert "did you mean nvidia.com/gpu?" in result.answer["response"]["warnings"][0]


def test_names_far_from_every_vendor_name_or_outside_vendor_domains_do_not_warn(webhook: Webhook) -> None:
    limits = {**gpu(1, 3000), "nvidia.com/mig-1g.10gb": "1", "example.com/fpga": "1", "cpu": "1"}
    result = webhook.admit(pod(container("c0", limits)))
    assert "warnings" not in result.answer["response"]


def test_a_memory_percentage_over_100_is_still_refused_as_hami_refuses_it(webhook: Webhook) -> None:
    limits = {**gpu(1, mem=None), "nvidia.com/gpumem-percentage": "150"}
    result = webhook.admit(pod(container("c0", limits)))
    assert not result.allowed
    assert "more than 100 percent" in result.message


def test_preset_node_name_is_denied(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), node="gpu-node-1"))
    assert not result.allowed
    assert result.code == 403
    assert "spec.nodeName is already set to 'gpu-node-1'" in result.message
    assert "nodeSelector" in result.message


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}, "nvidia.com/gpumem: '3Gi' is not a plain number"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}, "so write 3072"),
        ({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "150"}, "more than 100 percent"),
        ({"nvidia.com/gpu": "two"}, "nvidia.com/gpu: 'two' is not a plain non-negative integer"),
        ({MLU: "1", "cambricon.com/mlu.smlu.vmemory": "1.5"}, "counts 256 MiB"),
    ],
)
def test_unreadable_resource_values_are_denied_with_the_fix(
    webhook: Webhook, limits: dict[str, str], expected: str
) -> None:
    result = webhook.admit(pod(container("worker", limits)))
    assert not result.allowed
    assert result.code == 400
    assert "container worker: " in result.message
    assert expected in result.message


def test_ascend_cores_outside_soft_split_mode_are_denied_with_the_annotation_to_add(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("npu", {ASCEND: "1", f"{ASCEND}-memory": "8192", f"{ASCEND}-core": "20"})))
    assert not result.allowed
    assert "huawei.com/vnpu-mode: hami-core" in result.message


# ------------------------------------------------------------------------------------------------ ignore label


def test_pod_labelled_ignore_is_left_alone_whatever_it_asks(webhook: Webhook) -> None:
    obj = pod(container("c0", gpu(), privileged=True), node="n1", labels={"hami.io/webhook": "ignore"})
    result = webhook.admit(obj)
    assert result.allowed
    assert result.patch == []
    assert "labelled hami.io/webhook=ignore" in result.message


def test_namespace_labelled_ignore_is_left_alone(webhook: Webhook) -> None:
    webhook.cluster.create("namespaces", {"metadata": {"name": "batch", "labels": {"hami.io/webhook": "ignore"}}})
    webhook.cluster.flush()
    result = webhook.admit(pod(container("c0", gpu()), namespace="batch"))
    assert result.allowed
    assert result.patch == []
    assert "namespace batch is labelled hami.io/webhook=ignore" in result.message


def test_namespace_label_removed_later_is_seen_through_the_watch(webhook: Webhook) -> None:
    webhook.cluster.create("namespaces", {"metadata": {"name": "batch", "labels": {"hami.io/webhook": "ignore"}}})
    webhook.cluster.patch_metadata("namespaces", "batch", labels={"hami.io/webhook": None})
    webhook.cluster.flush()
    assert webhook.admit(pod(container("c0", gpu()), namespace="batch")).pod["spec"]["schedulerName"] == (
        "hami-scheduler"
    )


# ------------------------------------------------------------------------------------------------ containers


def test_multi_container_pod_with_init_container_names_every_request(webhook: Webhook) -> None:
    obj = pod(
        container("trainer", gpu(2, 3000, 30)),
        container("logger", {"cpu": "100m"}),
        container("eval", gpu(1, mem=None)),
        init=[container("warmup", gpu(1, 8000))],
    )
    result = webhook.admit(obj)
    assert result.allowed
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"} in result.patch
    assert result.pod["spec"]["containers"][1] == obj["spec"]["containers"][1]
    message = result.message
    assert "warmup 1 × (8000 MiB, 0% cores)" in message
    assert "trainer 2 × (3000 MiB, 30% cores)" in message
    assert "eval 1 × (100% memory, 100% cores)" in message  # a count alone is a whole card
    assert "logger" not in message


@pytest.mark.parametrize(
    "limits",
    [
        {ASCEND: "1", f"{ASCEND}-memory": "8192"},
        {MLU: "1", "cambricon.com/mlu.smlu.vmemory": "16"},
        {DCU: "1", "hygon.com/dcumem": "4000", "hygon.com/dcucores": "40"},
        {"metax-tech.com/sgpu": "1", "metax-tech.com/vmemory": "4"},
        {"mthreads.com/vgpu": "1", "mthreads.com/sgpu-memory": "8"},
        {"iluvatar.ai/BI-V150-vgpu": "1", "iluvatar.ai/BI-V150.vMem": "16"},
    ],
    ids=["ascend", "cambricon", "hygon", "metax", "mthreads", "iluvatar"],
)
def test_every_vendor_device_pod_goes_to_hami_scheduler(webhook: Webhook, limits: dict[str, str]) -> None:
    result = webhook.admit(pod(container("c0", limits), init=[container("init", {"cpu": "1"})]))
    assert result.allowed, result.message
    assert result.pod["spec"]["schedulerName"] == "hami-scheduler"


def test_pod_with_gpus_and_npus_is_admitted_once_for_both(webhook: Webhook) -> None:
    obj = pod(container("gpu", gpu()), container("npu", {ASCEND: "1", f"{ASCEND}-memory": "8192"}))
    result = webhook.admit(obj)
    assert result.allowed
    assert "Ascend910B3 (npu 1 × (8192 MiB" in result.message
    assert "NVIDIA (gpu 1 × (3000 MiB" in result.message


# ------------------------------------------------------------------------------------------------ vendor defaults


def test_vendor_defaults_become_limits_env_annotation_and_runtime_class(webhook: Webhook) -> None:
    obj = pod(
        container(
            "a", {"example.test/accel": "1", "example.test/accel-mem": "1000"}, env=[{"name": "X", "value": "1"}]
        ),
        container("b", {"example.test/accel": "1", "example.test/accel-priority": "0"}),
        annotations={"team": "ml"},
    )
    result = webhook.admit(obj)
    assert result.allowed, result.message
    spec = result.pod["spec"]
    assert spec["containers"][0]["resources"]["limits"]["example.test/accel-cores"] == "50"
    assert spec["containers"][1]["resources"]["limits"]["example.test/accel-cores"] == "50"
    assert spec["containers"][0]["env"] == [
        {"name": "X", "value": "1"},
        {"name": "TEST_ACCEL_TASK_PRIORITY", "value": "1"},
    ]
    assert spec["containers"][1]["env"] == [{"name": "TEST_ACCEL_TASK_PRIORITY", "value": "0"}]
    assert spec["runtimeClassName"] == "testaccel"
    assert result.pod["metadata"]["annotations"] == {"team": "ml", "example.test/admitted-by": "testaccel"}
    assert spec["schedulerName"] == "hami-scheduler"
    paths = [op["path"] for op in result.patch]
    assert "/metadata/annotations/example.test~1admitted-by" in paths  # '/' escaped as ~1
    assert "/spec/containers/0/env/-" in paths
    assert "container a limit example.test/accel-cores=50 (testaccel default)" in result.message
    assert "spec.runtimeClassName=testaccel (testaccel)" in result.message
    assert "50% cores" in result.message  # the requests were read again after the defaults


def test_patch_is_minimal_so_admitting_the_patched_pod_again_changes_nothing(webhook: Webhook) -> None:
    obj = pod(container("a", {"example.test/accel": "1"}), init=[container("i", {"example.test/accel": "1"})])
    first = webhook.admit(obj)
    assert first.allowed
    assert first.patch
    again = webhook.admit(first.pod)
    assert again.allowed
    assert again.patch == []


def test_vendor_limit_is_mirrored_into_a_request_of_the_same_resource(webhook: Webhook) -> None:
    limits = {"example.test/accel": "1"}
    requests = {"example.test/accel": "1", "example.test/accel-mem": "1500"}
    result = webhook.admit(pod(container("rounded", limits, requests=requests)))
    assert result.allowed, result.message
    resources = result.pod["spec"]["containers"][0]["resources"]
    assert resources["limits"]["example.test/accel-mem"] == "2048"
    assert resources["requests"]["example.test/accel-mem"] == "2048"  # Kubernetes wants them equal
    assert "request example.test/accel-mem=2048 (equal to its limit)" in result.message
    assert "rounded 1 × (2048 MiB" in result.message


def test_vendor_denial_is_the_answer(webhook: Webhook) -> None:
    obj = pod(container("a", {"example.test/accel": "1"}), annotations={DENY_ANNOTATION: "no such queue"})
    result = webhook.admit(obj)
    assert not result.allowed
    assert result.code == 403
    assert "vendor testaccel refuses container a: no such queue" in result.message


def test_vendor_request_error_in_defaults_names_the_resource(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("a", {"example.test/accel": "1", "example.test/accel-priority": "7"})))
    assert not result.allowed
    assert result.code == 400
    assert "example.test/accel-priority: '7' is not a priority" in result.message


def test_vendor_default_that_cannot_be_read_is_denied(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("bad-default", {"example.test/accel": "1"})))
    assert not result.allowed
    assert "after the vendors' defaults" in result.message
    assert "'2Gi'" in result.message


@pytest.mark.parametrize(("name", "hook"), [("explode", "admission defaults"), ("explode-read", "request")])
def test_a_vendor_hook_that_raises_is_a_denial_not_a_server_error(webhook: Webhook, name: str, hook: str) -> None:
    result = webhook.admit(pod(container(name, {"example.test/accel": "1"})))
    assert not result.allowed
    assert result.code == 500
    assert "vendor plugin testaccel failed" in result.message
    assert hook in result.message
    assert "bug in the plugin" in result.message


def test_runtime_class_the_user_chose_is_kept(webhook: Webhook) -> None:
    obj = pod(container("a", {"example.test/accel": "1"}), container("b", {"other.test/accel": "1"}))
    obj["spec"]["runtimeClassName"] = "kata"
    result = webhook.admit(obj)
    assert result.allowed, result.message
    assert result.pod["spec"]["runtimeClassName"] == "kata"
    assert "kept the pod's own runtimeClassName 'kata' (testaccel suggests 'testaccel')" in result.message
    assert not any(op["path"] == "/spec/runtimeClassName" for op in result.patch)


def test_vendors_that_disagree_on_the_runtime_class_deny_the_pod(webhook: Webhook) -> None:
    obj = pod(container("a", {"example.test/accel": "1"}), container("b", {"other.test/accel": "1"}))
    result = webhook.admit(obj)
    assert not result.allowed
    assert "testaccel sets 'testaccel', otheraccel sets 'other-runtime'" in result.message


# ------------------------------------------------------------------------------------------------ other requests


def test_update_is_left_alone(webhook: Webhook) -> None:
    result = webhook.admit(pod(container("c0", gpu()), node="n1"), operation="UPDATE")
    assert result.allowed
    assert result.patch == []
    assert "only pod CREATE" in result.message


def test_non_pod_object_is_left_alone(webhook: Webhook) -> None:
    body = review({"metadata": {"name": "d"}, "spec": {}})
    body["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    result = webhook.send(body)
    assert result.allowed
    assert "a Deployment, not a Pod" in result.message
