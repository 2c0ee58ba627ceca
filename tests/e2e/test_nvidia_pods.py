"""NVIDIA pods through the real path: kube-apiserver → webhook → kube-scheduler → extender → Binding → kubelet
→ node daemon's Allocate → Running, on two nodes of 2 × 16 GiB fake GPUs (split 10).

Each test states one behaviour a user relies on; the cluster is shared, the namespace is the test's own.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest
from control_plane import wait_until
from hami_stack import NAMESPACE as STACK_NAMESPACE
from hami_stack import GpuNode, HamiStack
from kube_rest import ApiError, KubeApi

from hami.codec import decode_pod_devices

pytestmark = pytest.mark.e2e

ALLOCATED = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
LOCK = "hami.io/mutex.lock"
LEASE_OFFER = "hami.io/node-lock-lease"


def gpu_pod(name: str, namespace: str, gpu: int = 1, mem: int | None = 3000, **annotations: str) -> dict[str, Any]:
    """A pod as a user writes it: no schedulerName, only HAMi's resources."""
    limits = {"nvidia.com/gpu": str(gpu)}
    if mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "containers": [{"name": "cuda", "image": "nvidia/cuda:12.4.1-base", "resources": {"limits": limits}}],
            "terminationGracePeriodSeconds": 1,
        },
    }


def pod(api: KubeApi, namespace: str, name: str) -> dict[str, Any]:
    return api.get("Pod", name, namespace)


def running(api: KubeApi, namespace: str, name: str) -> dict[str, Any] | None:
    got = pod(api, namespace, name)
    return got if got.get("status", {}).get("phase") == "Running" else None


def wait_running(stack: HamiStack, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    found: dict[str, Any] = wait_until(
        lambda: running(stack.admin, namespace, name),
        timeout,
        f"pod {namespace}/{name} Running",
        lambda: describe(stack, namespace, name),
    )
    return found


def describe(stack: HamiStack, namespace: str, name: str) -> str:
    try:
        got = pod(stack.admin, namespace, name)
        events = [f"{e['reason']}: {e['message']}" for e in stack.admin.events_about(namespace, name)]
    except ApiError as exc:
        return f"pod {namespace}/{name}: {exc}"
    return f"pod: {got.get('metadata')}\nstatus: {got.get('status')}\nevents: {events}\n{stack.diagnose()}"


def scheduling_failures(api: KubeApi, namespace: str, name: str) -> list[str]:
    return [e["message"] for e in api.events_about(namespace, name) if e["reason"] == "FailedScheduling"]


def node_locks(api: KubeApi) -> dict[str, str]:
    """node → who holds its lock: the node annotation, or the node's Lease (`hami.io/node-lock-lease`, this
    project's daemons) while the pod it names still allocates (a Lease is never released: its holder's bind phase
    frees it)."""
    held = {}
    for n in api.list("Node")["items"]:
        annotations = n["metadata"].get("annotations") or {}
        if LOCK in annotations:
            held[n["metadata"]["name"]] = annotations[LOCK]
        elif LEASE_OFFER in annotations:
            namespace, _, name = annotations[LEASE_OFFER].partition("/")
            holder = api.get("Lease", name, namespace)["spec"].get("holderIdentity") or ""
            if holder.count("/") == 2:
                pod_namespace, pod_name, uid = holder.split("/")
                try:
                    owner = pod(api, pod_namespace, pod_name)
                except ApiError:
                    continue
                phase = (owner["metadata"].get("annotations") or {}).get("hami.io/bind-phase")
                if owner["metadata"]["uid"] == uid and phase == "allocating":
                    held[n["metadata"]["name"]] = holder
    return held


def allocated_mib(metrics: str, namespace: str) -> dict[str, float]:
    """The scheduler's hami_vgpu_memory_allocated_bytes per pod of `namespace`, in MiB."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("hami_vgpu_memory_allocated_bytes{") and f'namespace="{namespace}"' in line:
            pod_name = re.search(r'pod="([^"]+)"', line)
            assert pod_name is not None
            found[pod_name.group(1)] = found.get(pod_name.group(1), 0.0) + float(line.rsplit(" ", 1)[1]) / 2**20
    return found


def device_allocated_mib(metrics: str) -> dict[str, float]:
    """The scheduler's hami_gpu_memory_allocated_bytes per NVIDIA device UUID, in MiB."""
    found = {}
    for line in metrics.splitlines():
        if line.startswith("hami_gpu_memory_allocated_bytes{") and 'device_uuid="GPU-' in line:
            uuid = re.search(r'device_uuid="([^"]+)"', line)
            assert uuid is not None
            found[uuid.group(1)] = float(line.rsplit(" ", 1)[1]) / 2**20
    return found


def summary(stack: HamiStack, namespace: str) -> str:
    """Each pod's phase, node, bind phase and last scheduling event; the node locks; the processes' logs."""
    lines = []
    for p in stack.admin.list("Pod", namespace)["items"]:
        name, annotations = p["metadata"]["name"], p["metadata"].get("annotations") or {}
        failures = scheduling_failures(stack.admin, namespace, name)
        lines.append(
            f"{name}: {p['status'].get('phase')} node={p['spec'].get('nodeName')} "
            f"vgpu-node={annotations.get('hami.io/vgpu-node')} bind-phase={annotations.get('hami.io/bind-phase')} "
            f"last-failure={failures[-1] if failures else None}"
        )
    lines.append(f"locks: {node_locks(stack.admin)}")
    return "\n".join(lines) + "\n" + stack.diagnose()


def started(stack: HamiStack, uid: str) -> Any:
    for node in stack.nodes.values():
        if uid in node.kubelet.started:
            return node, node.kubelet.started[uid]
    return None


# ------------------------------------------------------------------------------------------ scenarios


def test_a_shared_gpu_pod_is_mutated_scheduled_bound_and_allocated(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    created = api.create(gpu_pod("first", ns))
    assert created["spec"]["schedulerName"] == "hami-scheduler", "the webhook sends the pod to HAMi's scheduler"
    got = wait_running(stack, ns, "first")
    annotations = got["metadata"]["annotations"]
    node_name = got["spec"]["nodeName"]
    assert annotations["hami.io/vgpu-node"] == node_name
    assert got["metadata"]["labels"]["hami.io/vgpu-node"] == node_name
    assert annotations["hami.io/bind-phase"] == "success"
    assert annotations["hami.io/vgpu-time"].isdigit()
    ((device,),) = decode_pod_devices(annotations[ALLOCATED])
    node = stack.nodes[node_name]
    assert isinstance(node, GpuNode)
    assert device.uuid in node.uuids
    assert (device.usedmem, device.usedcores) == (3000, 0)
    assert decode_pod_devices(annotations[TO_ALLOCATE]) == ((),), "the node side emptied what it served"
    assert node_name not in node_locks(api), "the node lock is released after Allocate"
    offer = api.get("Node", node_name)["metadata"]["annotations"][LEASE_OFFER]
    assert offer == f"{STACK_NAMESPACE}/hami-node-lock-{node_name}", "the daemon offers its lock as a Lease"
    lease = api.get("Lease", offer.split("/")[1], STACK_NAMESPACE)
    uid = got["metadata"]["uid"]
    assert lease["spec"]["holderIdentity"] == f"{ns}/first/{uid}", "the scheduler locked the node through it"
    assert LOCK not in api.get("Node", node_name)["metadata"]["annotations"]

    _, served = wait_until(lambda: started(stack, got["metadata"]["uid"]), 10, "kubelet record")
    edits = served.edits["cuda"]["nvidia.com/gpu"]
    assert edits.env["NVIDIA_VISIBLE_DEVICES"] == device.uuid
    assert edits.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert edits.env["CUDA_DEVICE_SM_LIMIT"] == "0"
    assert edits.env["CUDA_DEVICE_MEMORY_SHARED_CACHE"].startswith(str(node.dir / "usr" / "vgpu") + "/")
    mounts = {m.container_path: m.host_path for m in edits.mounts}
    library = node.dir / "hook" / "nvidia" / "libvgpu.so"
    assert mounts[str(library)] == str(library)
    assert (node.dir / "hook" / "nvidia" / "libvgpu.so").resolve().is_file()
    assert "/etc/ld.so.preload" in mounts
    assert str(library) in Path(mounts["/etc/ld.so.preload"]).read_text()
    assert edits.cdi_devices == (f"nvidia.com/gpu={device.uuid}",)
    assert allocated_mib(stack.scheduler_metrics(), ns) == {"first": 3000.0}


def test_a_second_pod_shares_the_card_of_the_first(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    api.create(gpu_pod("first", ns, mem=4000))
    first = wait_running(stack, ns, "first")
    ((card,),) = decode_pod_devices(first["metadata"]["annotations"][ALLOCATED])
    api.create(gpu_pod("second", ns, mem=4000, **{"hami.io/gpu-scheduler-policy": "binpack"}))
    second = wait_running(stack, ns, "second")
    ((shared,),) = decode_pod_devices(second["metadata"]["annotations"][ALLOCATED])
    assert second["spec"]["nodeName"] == first["spec"]["nodeName"], "binpack keeps the node"
    assert shared.uuid == card.uuid, "binpack puts the second pod on the same card"
    assert device_allocated_mib(stack.scheduler_metrics())[card.uuid] == 8000.0


def test_a_pod_that_fits_nowhere_stays_pending_with_the_extenders_reason(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    api.create(gpu_pod("too-big", ns, mem=20000))
    messages = wait_until(
        lambda: scheduling_failures(api, ns, "too-big"),
        60,
        "a FailedScheduling event",
        lambda: describe(stack, ns, "too-big"),
    )
    got = pod(api, ns, "too-big")
    assert got["status"]["phase"] == "Pending"
    assert "nodeName" not in got["spec"]
    assert ALLOCATED not in (got["metadata"].get("annotations") or {})
    # kube-scheduler folds the extender's identical per-node reasons into one count: both GPU nodes said it.
    assert any("2 needs 1 NVIDIA device with 20000 MiB free" in m for m in messages), messages


def test_a_pod_over_its_namespace_quota_is_refused_at_admission(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu-memory", "namespace": ns},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "5000"}},
    }
    api.create(quota)
    # Admission sees the quota through its watch: until then a pod is admitted, so probe with dry runs.
    wait_until(
        lambda: api.refuses_for_quota(gpu_pod("probe", ns, mem=6000)), 30, "the webhook knows the quota", stack.diagnose
    )
    api.create(gpu_pod("within", ns, mem=3000))
    wait_running(stack, ns, "within")
    with pytest.raises(ApiError) as refused:
        api.create(gpu_pod("over", ns, mem=3000))
    assert refused.value.status in (400, 403)
    assert "quota" in refused.value.message.lower()
    assert "nvidia.com/gpumem" in refused.value.message
    with pytest.raises(ApiError):
        pod(api, ns, "over")


def test_a_deleted_running_pod_frees_its_usage_for_the_next(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    names = [f"big-{i}" for i in range(4)]
    for name in names:
        api.create(gpu_pod(name, ns, mem=15000))
    for name in names:
        wait_running(stack, ns, name)
    api.create(gpu_pod("waiting", ns, mem=15000))
    wait_until(lambda: scheduling_failures(api, ns, "waiting"), 60, "the fifth pod is refused")
    victim = pod(api, ns, "big-0")
    api.delete("Pod", "big-0", ns)  # graceful: the kubelet confirms, as a real one does
    wait_until(lambda: "big-0" not in allocated_mib(stack.scheduler_metrics(), ns), 30, "usage of big-0 freed")
    got = wait_running(stack, ns, "waiting", timeout=120)
    ((device,),) = decode_pod_devices(got["metadata"]["annotations"][ALLOCATED])
    ((freed,),) = decode_pod_devices(victim["metadata"]["annotations"][ALLOCATED])
    assert device.uuid == freed.uuid, "the only free card is the deleted pod's"
    assert node_locks(api) == {}


def test_a_pod_deleted_between_bind_and_allocate_frees_its_node_lock(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    for node in stack.nodes.values():
        node.kubelet.pause()
    api.create(gpu_pod("stalled", ns))
    bound = wait_until(lambda: pod(api, ns, "stalled")["spec"].get("nodeName"), 60, "bound")
    assert bound in node_locks(api), "bind locks the node until the kubelet allocates"
    api.delete("Pod", "stalled", ns, grace=0)
    wait_until(lambda: bound not in node_locks(api), 30, "lock of the deleted pod released", stack.diagnose)
    for node in stack.nodes.values():
        node.kubelet.resume()
    api.create(gpu_pod("next", ns, **{"hami.io/gpu-scheduler-policy": "binpack"}))
    wait_running(stack, ns, "next")
    assert "stalled" not in allocated_mib(stack.scheduler_metrics(), ns)


def test_fifty_pods_at_once_end_bound_or_cleanly_pending_with_no_lock_left(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    names = [f"burst-{i:02d}" for i in range(50)]
    errors: list[BaseException] = []

    def create(chunk: list[str]) -> None:
        for name in chunk:
            try:
                api.create(gpu_pod(name, ns, mem=3000))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=create, args=(names[i::5],)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    # 4 GPUs × 16384 MiB hold 5 pods of 3000 MiB each: 20 run, 30 stay pending.

    def settled() -> dict[str, list[str]] | None:
        pods = api.list("Pod", ns)["items"]
        running_pods = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
        if len(running_pods) < 20:
            return None
        pending = [p for p in pods if p["status"].get("phase") == "Pending"]
        if any(p["spec"].get("nodeName") for p in pending):
            return None
        refused = {p["metadata"]["name"] for p in pending if scheduling_failures(api, ns, p["metadata"]["name"])}
        if len(refused) < len(pending):
            return None
        return {"running": running_pods, "pending": [p["metadata"]["name"] for p in pending]}

    state = wait_until(settled, 240, "50 pods settled", lambda: summary(stack, ns))
    assert (len(state["running"]), len(state["pending"])) == (20, 30)
    assert node_locks(api) == {}
    per_device = device_allocated_mib(stack.scheduler_metrics())
    assert sorted(per_device.values()) == [15000.0] * 4
    failed = [p for p in api.list("Pod", ns)["items"] if p["status"].get("phase") == "Failed"]
    assert failed == []
    for name in state["pending"]:
        assert ALLOCATED not in (pod(api, ns, name)["metadata"].get("annotations") or {}), f"{name} holds a placement"
    for p in api.list("Pod", ns)["items"]:
        if p["status"].get("phase") == "Running":
            assert p["metadata"]["annotations"]["hami.io/bind-phase"] == "success"


def test_a_restarted_extender_rebuilds_the_same_state(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    for i in range(3):
        api.create(gpu_pod(f"before-{i}", ns, mem=5000))
    for i in range(3):
        wait_running(stack, ns, f"before-{i}")
    before_pods = allocated_mib(stack.scheduler_metrics(), ns)
    before_devices = device_allocated_mib(stack.scheduler_metrics())
    assert stack.stop_scheduler() == 0
    # While the extender is down its webhook is down too: failurePolicy Ignore admits the pod unmutated, so this
    # one names the scheduler itself. kube-scheduler's filter calls fail and it waits in the backoff queue.
    during = gpu_pod("during", ns, mem=5000)
    during["spec"]["schedulerName"] = "hami-scheduler"
    api.create(during)
    stack.start_scheduler()
    # kube-scheduler may place "during" as soon as the extender answers: one scrape, without what "during" holds
    metrics = stack.scheduler_metrics()
    after_pods = allocated_mib(metrics, ns)
    after_pods.pop("during", None)
    assert after_pods == before_pods
    after_devices = device_allocated_mib(metrics)
    for line in metrics.splitlines():
        if line.startswith("hami_vgpu_memory_allocated_bytes{") and 'pod="during"' in line:
            uuid = re.search(r'device_uuid="([^"]+)"', line)
            assert uuid is not None
            after_devices[uuid.group(1)] -= float(line.rsplit(" ", 1)[1]) / 2**20
    assert {k: v for k, v in after_devices.items() if v} == {k: v for k, v in before_devices.items() if v}
    got = wait_running(stack, ns, "during", timeout=120)
    ((device,),) = decode_pod_devices(got["metadata"]["annotations"][ALLOCATED])
    assert device_allocated_mib(stack.scheduler_metrics())[device.uuid] == before_devices.get(device.uuid, 0) + 5000
    assert node_locks(api) == {}


def test_an_extender_restarted_during_a_burst_double_books_nothing(stack: HamiStack, ns: str) -> None:
    api = stack.admin
    names = [f"wave-{i:02d}" for i in range(24)]
    for name in names[:12]:
        # The webhook restarts with the extender (failurePolicy Ignore): these pods name the scheduler themselves.
        obj = gpu_pod(name, ns, mem=6000)
        obj["spec"]["schedulerName"] = "hami-scheduler"
        api.create(obj)
    assert stack.stop_scheduler() == 0
    for name in names[12:]:
        obj = gpu_pod(name, ns, mem=6000)
        obj["spec"]["schedulerName"] = "hami-scheduler"
        api.create(obj)
    stack.start_scheduler()
    # 4 GPUs × 16384 MiB hold 2 pods of 6000 MiB each: 8 run, 16 stay pending.

    def settled() -> list[dict[str, Any]] | None:
        pods = api.list("Pod", ns)["items"]
        phases = [p["status"].get("phase") for p in pods]
        if phases.count("Running") < 8 or any(
            p["spec"].get("nodeName") for p in pods if p["status"]["phase"] == "Pending"
        ):
            return None
        return list(pods)

    pods = wait_until(settled, 180, "the burst settled", lambda: summary(stack, ns))
    used: dict[str, int] = {}
    for p in pods:
        if p["status"]["phase"] == "Running":
            ((device,),) = decode_pod_devices(p["metadata"]["annotations"][ALLOCATED])
            used[device.uuid] = used.get(device.uuid, 0) + device.usedmem
    assert sorted(used.values()) == [12000] * 4, "two pods per card, none over its memory"
    for p in pods:
        if p["status"]["phase"] == "Pending":  # placements abandoned by the restart were withdrawn
            assert ALLOCATED not in (p["metadata"].get("annotations") or {}), p["metadata"]["name"]
    assert sum(p["status"]["phase"] == "Running" for p in pods) == 8
    assert node_locks(api) == {}
    metrics = device_allocated_mib(stack.scheduler_metrics())
    assert {u: metrics[u] for u in used} == {u: float(v) for u, v in used.items()}, "the scheduler counts what runs"
