"""Filter and bind through the real HTTP extender on an in-memory cluster."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from typing import Any

from scheduler_harness import FakeNodeSide, Harness, gpu_node, gpu_pod, post_raw

from hami.cluster import MemoryCluster, meta
from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.port import ClusterError, WatchEvent
from hami.model import ContainerRequest
from hami.scheduler.extender import BIND_PHASE, ExtenderSettings
from hami.scheduler.policies import ObservedWorkload


def annotations(h: Harness, pod: str) -> dict[str, str]:
    return dict(meta(h.cluster.get("pods", pod, "default")).get("annotations") or {})


def test_filter_places_a_pod_and_writes_hamis_annotations(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2))
    harness.add_pod(gpu_pod("p1", gpu=1, mem=3000, cores=30))
    harness.start()
    answer = harness.filter("p1")
    assert answer == {
        "NodeNames": ["node-a"],
        "Nodes": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    got = annotations(harness, "p1")
    # spread (the default device policy) takes the idlest card; ties: HAMi's highest NUMA node, then highest index
    assert got["hami.io/vgpu-devices-allocated"] == "GPU-node-a-1,NVIDIA,3000,30:;"
    assert got["hami.io/vgpu-devices-to-allocate"] == "GPU-node-a-1,NVIDIA,3000,30:;"
    assert got["hami.io/vgpu-node"] == "node-a"
    assert abs(int(got["hami.io/vgpu-time"]) - time.time()) < 5
    assert meta(harness.cluster.get("pods", "p1", "default"))["labels"]["hami.io/vgpu-node"] == "node-a"


def test_init_and_app_containers_are_positional_in_the_annotation(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2))
    gpu = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2500", "nvidia.com/gpucores": "25"}
    harness.add_pod(gpu_pod("p", init=[{"cpu": "1"}], apps=[gpu, gpu]))
    harness.start()
    assert harness.filter("p")["NodeNames"] == ["node-a"]
    value = annotations(harness, "p")["hami.io/vgpu-devices-allocated"]
    assert value == ";GPU-node-a-1,NVIDIA,2500,25:;GPU-node-a-0,NVIDIA,2500,25:;"


def test_next_pod_sees_the_previous_decision_at_once(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=1, memory=8000))
    harness.add_pod(gpu_pod("p1", mem=5000))
    harness.add_pod(gpu_pod("p2", mem=5000))
    harness.start()
    assert harness.filter("p1")["NodeNames"] == ["node-a"]
    answer = harness.filter("p2")  # no flush: the watch may not have delivered p1's annotations yet
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {"node-a": "needs 1 NVIDIA device with 5000 MiB free, 0/1 of its devices have it"}


def test_binpack_and_spread_node_policies(harness: Harness) -> None:
    for name in ("node-a", "node-b"):
        harness.add_node(gpu_node(name, gpus=2))
    harness.add_pod(gpu_pod("first", mem=4000))
    harness.start()
    first = harness.filter("first")["NodeNames"][0]
    harness.add_pod(gpu_pod("packed", mem=1000))
    harness.add_pod(gpu_pod("spread", mem=1000, annotations={"hami.io/node-scheduler-policy": "spread"}))
    assert harness.filter("packed")["NodeNames"] == [first]
    assert harness.filter("spread")["NodeNames"] != [first]


def test_device_policy_and_selectors_from_annotations(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a", gpus=2))
    harness.add_pod(gpu_pod("first", mem=1000))
    harness.start()
    harness.filter("first")  # takes GPU 1 (equal scores: the highest index)
    harness.add_pod(gpu_pod("binpack", mem=1000, annotations={"hami.io/gpu-scheduler-policy": "binpack"}))
    harness.add_pod(gpu_pod("avoid", mem=1000, annotations={"nvidia.com/nouse-gpuuuid": "GPU-node-a-0"}))
    harness.add_pod(gpu_pod("bad", annotations={"hami.io/gpu-scheduler-policy": "tightest"}))
    assert annotations_after(harness, "binpack").startswith("GPU-node-a-1,")
    assert annotations_after(harness, "avoid").startswith("GPU-node-a-1,")
    answer = harness.filter("bad")
    assert "hami.io/gpu-scheduler-policy: 'tightest' is not a comma list" in answer["Error"]


def annotations_after(h: Harness, pod: str) -> str:
    assert h.filter(pod)["NodeNames"]
    return annotations(h, pod)["hami.io/vgpu-devices-allocated"]


def test_rejected_nodes_each_get_a_reason(harness: Harness) -> None:
    harness.add_node(gpu_node("small", gpus=1, memory=4000))
    harness.add_node(gpu_node("two", gpus=2, memory=16000))
    harness.add_node({"metadata": {"name": "cpu-only"}})
    harness.add_pod(gpu_pod("big", gpu=2, mem=8000))
    harness.start()
    answer = harness.filter("big", nodes=["small", "cpu-only", "two", "unknown"])
    assert answer["NodeNames"] == ["two"]
    assert answer["FailedNodes"] == {
        "cpu-only": "no NVIDIA devices registered",
        "unknown": "no NVIDIA devices registered",
        "small": "needs 2 NVIDIA devices with 8000 MiB free, 0/1 of its devices have it",
    }
    harness.add_pod(gpu_pod("huge", gpu=2, mem=20000))
    answer = harness.filter("huge", nodes=["small", "two"])
    assert answer["FailedNodes"] == {
        "small": "needs 2 NVIDIA devices with 20000 MiB free, 0/1 of its devices have it",
        "two": "needs 2 NVIDIA devices with 20000 MiB free, 0/2 of its devices have it",
    }


def test_pod_without_shared_devices_passes_through(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "c"}]}})
    harness.start()
    assert harness.filter("web", nodes=["node-a", "other"])["NodeNames"] == ["node-a", "other"]


def test_lowercase_keys_and_full_node_lists_are_understood(harness: Harness) -> None:
    node = gpu_node("node-a")
    harness.add_node(node)
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    pod = harness.cluster.get("pods", "p1", "default")
    status, answer = harness.post("filter", {"pod": pod, "nodes": {"items": [node, {"metadata": {"name": "x"}}]}})
    assert status == 200
    assert [meta(n)["name"] for n in answer["Nodes"]["items"]] == ["node-a"]
    assert answer["NodeNames"] is None
    assert answer["FailedNodes"] == {"x": "no NVIDIA devices registered"}


def test_a_full_node_list_answer_carries_the_chosen_nodes_bytes_as_sent(harness: Harness) -> None:
    """The Nodes of the answer are the bytes kube-scheduler sent for them (fields the scheduler does not read,
    their order and spacing, integer quantities and nulls included), not a re-encoding of what was decoded."""
    node = gpu_node("node-a")
    harness.add_node(node)
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    assert harness.server is not None
    pod = json.dumps(harness.cluster.get("pods", "p1", "default")).encode()
    sent = json.dumps({"status": {"images": [{"sizeBytes": 7}], "capacity": {"cpu": 8}}, **node}, indent=1).encode()
    other = b'{"metadata": {"name": "x"}, "spec": null}'
    body = b'{"Pod": ' + pod + b', "Nodes": {"items": [' + other + b", " + sent + b"]}}"
    status, answer = post_raw(harness.server.port, "/filter", body)
    assert status == 200
    assert b'"items":[' + sent + b"]" in answer
    decoded = json.loads(answer)
    assert decoded["Nodes"] == {"metadata": {}, "items": [json.loads(sent)]}
    assert (decoded["NodeNames"], decoded["Error"]) == (None, "")
    assert decoded["FailedNodes"] == {"x": "no NVIDIA devices registered"}


def test_unreadable_resources_are_an_error_that_names_them(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p", mem=None, apps=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3Gi"}]))
    harness.start()
    assert "nvidia.com/gpumem: '3Gi'" in harness.filter("p")["Error"]


def test_bind_locks_the_node_marks_allocating_and_binds(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    harness.filter("p1")
    assert harness.bind("p1", "node-a") == {"Error": ""}
    pod = harness.cluster.get("pods", "p1", "default")
    assert pod["spec"]["nodeName"] == "node-a"
    assert meta(pod)["annotations"][BIND_PHASE] == "allocating"
    lock = meta(harness.cluster.get("nodes", "node-a"))["annotations"][LOCK_ANNOTATION]
    # HAMi's form, `<RFC3339>,<namespace>,<name>`: HAMi's device plugins release only a lock ending so
    assert lock.split(",")[1:] == ["default", "p1"]


def test_bind_to_a_node_locked_by_a_live_pod_asks_for_a_retry(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.add_pod(gpu_pod("p2"))
    harness.start()
    harness.filter("p1")
    harness.bind("p1", "node-a")
    harness.filter("p2")
    started = time.monotonic()
    answer = harness.bind("p2", "node-a")
    assert "node node-a is locked by pod default/p1" in answer["Error"]
    assert "retry" in answer["Error"]
    assert time.monotonic() - started < 2
    assert "nodeName" not in harness.cluster.get("pods", "p2", "default")["spec"]


def test_bind_failure_releases_the_lock(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    harness.filter("p1")

    def refused(*args: Any, **kwargs: Any) -> None:
        raise ClusterError("the API server refused the Binding")

    harness.cluster.bind = refused  # type: ignore[method-assign]
    answer = harness.bind("p1", "node-a")
    assert "failed" in answer["Error"]
    assert LOCK_ANNOTATION not in meta(harness.cluster.get("nodes", "node-a")).get("annotations", {})
    assert meta(harness.cluster.get("pods", "p1", "default"))["annotations"][BIND_PHASE] == "failed"


def test_a_bind_with_another_uid_than_the_placed_pods_touches_nothing(harness: Harness) -> None:
    """Refused from the scheduler's own state, before the node is locked or the pod's bind phase written."""
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    harness.filter("p1")
    pod_before = harness.cluster.get("pods", "p1", "default")
    body = {"PodName": "p1", "PodNamespace": "default", "PodUID": "not-the-uid", "Node": "node-a"}
    status, answer = harness.post("bind", body)
    assert status == 200
    assert "was placed with UID" in answer["Error"]
    assert LOCK_ANNOTATION not in meta(harness.cluster.get("nodes", "node-a")).get("annotations", {})
    assert harness.cluster.get("pods", "p1", "default") == pod_before
    assert harness.post("bind", {**body, "PodUID": ""})[0] == 400


def test_lock_of_a_pod_deleted_before_allocation_is_freed_within_a_second(harness: Harness) -> None:
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    harness.filter("p1")
    harness.bind("p1", "node-a")
    harness.cluster.delete("pods", "p1", "default")
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        if LOCK_ANNOTATION not in (meta(harness.cluster.get("nodes", "node-a")).get("annotations") or {}):
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the lock of a deleted pod was still held after a second")


def test_the_lock_of_an_allocated_pod_is_left_to_the_node_side_and_free_to_the_next_bind(harness: Harness) -> None:
    """The node side writes `bind-phase: success` and then releases the lock itself: the scheduler does not race
    it for that release (a read and a conflicting write per pod). A lock it leaves behind, as a daemon that died
    in between would, does not block the node: the next bind takes it over."""
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.add_pod(gpu_pod("p2"))
    harness.start()
    harness.filter("p1")
    assert harness.bind("p1", "node-a") == {"Error": ""}
    harness.cluster.patch_metadata("pods", "p1", "default", annotations={BIND_PHASE: "success"})
    harness.flush()
    time.sleep(0.2)  # time for a watch-driven release, were there one
    holder = meta(harness.cluster.get("nodes", "node-a"))["annotations"][LOCK_ANNOTATION]
    assert holder.split(",")[2] == "p1"
    assert harness.filter("p2")["NodeNames"] == ["node-a"]
    assert harness.bind("p2", "node-a") == {"Error": ""}
    holder = meta(harness.cluster.get("nodes", "node-a"))["annotations"][LOCK_ANNOTATION]
    assert holder.split(",")[2] == "p2"


def test_restart_rebuilds_exactly_the_same_usage(harness: Harness) -> None:
    for name in ("node-a", "node-b"):
        harness.add_node(gpu_node(name, gpus=4))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    for i in range(12):
        harness.add_pod(gpu_pod(f"p{i}", gpu=1 + i % 2, mem=1000 + 100 * i, cores=5 * (i % 3)))
        harness.schedule(f"p{i}")
    harness.flush()
    assert harness.service is not None
    before = harness.service.state.usage_snapshot()
    harness.restart()
    assert harness.service.state.usage_snapshot() == before
    node_side.stop()


def test_a_hundred_pods_on_one_node_all_placed_or_refused_and_no_lock_left(harness: Harness) -> None:
    harness.add_node(gpu_node("only", gpus=8, memory=16000, split=10))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    placed = refused = 0
    for i in range(100):
        harness.add_pod(gpu_pod(f"p{i}", gpu=1, mem=1500))
        node = harness.schedule(f"p{i}")
        if node:
            placed += 1
        else:
            refused += 1
    harness.flush()
    assert placed == 8 * 10  # 8 cards × split 10: the slot limit binds before memory (10 × 1500 ≤ 16000)
    assert refused == 20
    assert LOCK_ANNOTATION not in (meta(harness.cluster.get("nodes", "only")).get("annotations") or {})
    node_side.stop()


def test_lock_left_by_a_pod_placed_again_elsewhere_is_taken_over(harness: Harness) -> None:
    # a scheduler died between locking node-a for p1 and binding it; p1 was then placed on node-b
    harness.add_node(gpu_node("node-a", gpus=1))
    harness.add_node(gpu_node("node-b", gpus=1))
    harness.add_pod(gpu_pod("p1"))
    harness.add_pod(gpu_pod("p2"))
    harness.start()
    p1 = harness.cluster.get("pods", "p1", "default")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # a fresh lock: not expired
    lock = f"{now},default,p1,{meta(p1)['uid']}"
    harness.cluster.patch_metadata("nodes", "node-a", annotations={LOCK_ANNOTATION: lock})
    assert harness.filter("p1", nodes=["node-b"])["NodeNames"] == ["node-b"]
    harness.flush()
    assert harness.filter("p2", nodes=["node-a"])["NodeNames"] == ["node-a"]
    assert harness.bind("p2", "node-a") == {"Error": ""}
    holder = meta(harness.cluster.get("nodes", "node-a"))["annotations"][LOCK_ANNOTATION]
    assert holder.split(",")[2] == "p2"


def test_nodes_of_models_the_pod_does_not_select_are_fitted_last() -> None:
    # binpack ranks the seven busy A100 nodes first; the pod selects H100, found only on the idle node: with
    # batches of two, the fit must go to the H100 node at once instead of refusing three batches of A100s first.
    h = Harness(ExtenderSettings(batch_size=2, bind_lock_wait_seconds=0.5))
    for i in range(7):
        h.add_node(gpu_node(f"a100-{i}", gpus=2))
        h.add_pod(gpu_pod(f"busy-{i}", mem=1000))
    h.add_node(gpu_node("h100", gpus=2, model="NVIDIA-H100"))
    h.add_pod(gpu_pod("picky", mem=1000, annotations={"nvidia.com/use-gputype": "H100"}))
    h.start()
    for i in range(7):
        assert h.filter(f"busy-{i}", [f"a100-{i}"])["NodeNames"] == [f"a100-{i}"]
    fitted: list[list[str]] = []
    fit_nodes = h.plugins.fit_nodes

    def counting(kind: str, pod: Any, requests: Any, views: Any, policy: Any) -> Any:
        fitted.append([v.name for v in views])
        return fit_nodes(kind, pod, requests, views, policy)

    h.plugins.fit_nodes = counting  # type: ignore[method-assign]
    assert h.filter("picky")["NodeNames"] == ["h100"]
    assert fitted[0][0] == "h100"
    assert len(fitted) == 1
    h.stop()


def test_observed_workload_keeps_cpu_memory_and_type_and_ignores_small_drift() -> None:
    def request(count: int, cores: int) -> dict[str, list[ContainerRequest | None]]:
        return {"NVIDIA": [ContainerRequest(kind="NVIDIA", count=count, memory=0, cores=cores)]}

    observed = ObservedWorkload(window=100, refresh=10, drift=0.2)
    observed.observe(request(1, 50), cpu=1500, memory=3000, models={"NVIDIA": ("a100",)})
    first = observed.profile()
    assert first is not None
    # CPU and memory are rounded up to the policy's buckets (1000 millicores, 1024 MiB)
    assert list(first.tasks) == [(1, 500, 2000, 3072, ("a100",))]
    for _ in range(19):
        observed.observe(request(1, 50), cpu=1500, memory=3000, models={"NVIDIA": ("a100",)})
    assert observed.profile() is first  # recounted, the same mix: no new profile, the nodes keep their evaluations
    for _ in range(20):
        observed.observe(request(2, 100), cpu=8000, memory=0)
    changed = observed.profile()
    assert changed is not first
    assert changed is not None
    assert changed.tasks[(2, 1000, 8000, 0, ())] == 0.5


def test_a_restarted_scheduler_plans_for_the_running_pods_mix_at_once() -> None:
    h = Harness(ExtenderSettings(node_policy="fragmentation-aware", bind_lock_wait_seconds=0.5))
    h.add_node(gpu_node("n1", gpus=4))
    for i in range(3):
        half = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50", "nvidia.com/gpucores": "50"}
        h.add_pod(gpu_pod(f"half-{i}", apps=[half], annotations={"nvidia.com/use-gputype": "A100"}))
    h.add_pod({**gpu_pod("done", gpu=2, cores=100, mem=None), "status": {"phase": "Succeeded"}})
    h.start()
    assert h.service is not None
    profile = h.service.extender.workload.profile()
    assert profile is not None  # before any filter: learned from the pods already there
    assert list(profile.tasks) == [(1, 500, 0, 0, ("a100",))]  # the finished pod teaches nothing
    h.stop()


class _RefusesPlacements(MemoryCluster):
    """An API server that refuses to write placements on pods (and everything else works)."""

    def patch_metadata(self, resource: str, name: str, namespace: str | None = None, **kwargs: Any) -> Any:
        if resource == "pods" and (kwargs.get("annotations") or {}).get("hami.io/vgpu-node"):
            raise ClusterError("the API server is down for pods")
        return super().patch_metadata(resource, name, namespace, **kwargs)  # type: ignore[arg-type]

    def bind(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        if (kwargs.get("annotations") or {}).get("hami.io/vgpu-node"):  # a Binding carrying the placement
            raise ClusterError("the API server is down for pods")
        super().bind(namespace, name, uid, node, **kwargs)


AT_BIND = ExtenderSettings(bind_lock_wait_seconds=0.5, record_at_bind=True)
"""Decisions written with the bind (`record_at_bind`, as `hami scheduler` does)."""


def test_a_decision_whose_write_fails_is_undone_and_its_bind_answers_why() -> None:
    h = Harness(AT_BIND, cluster=_RefusesPlacements())
    try:
        h.add_node(gpu_node("node-a"))
        h.add_pod(gpu_pod("p1"))
        h.start()
        assert h.filter("p1")["NodeNames"] == ["node-a"]  # answered without a write
        assert h.service is not None
        assert h.service.state.pods["default/p1"].assumed  # counted at once
        answer = h.bind("p1", "node-a")  # the write, with the bind phase, fails
        assert "default/p1" not in h.service.state.pods  # the decision no longer counts
        assert "could not record the placement of default/p1 on node-a" in answer["Error"]
        assert "retry" in answer["Error"]
        assert "nodeName" not in h.cluster.get("pods", "p1", "default")["spec"]
        assert LOCK_ANNOTATION not in (meta(h.cluster.get("nodes", "node-a")).get("annotations") or {})
    finally:
        h.stop()


def test_a_pod_whose_placement_this_scheduler_never_saw_is_not_bound(harness: Harness) -> None:
    """As after a scheduler that answered the filter died before its bind came: binding the pod would
    leave the node side without a placement, so kube-scheduler is asked to schedule it again."""
    harness.settings = AT_BIND
    harness.add_node(gpu_node("node-a"))
    harness.add_pod(gpu_pod("p1"))
    harness.start()
    answer = harness.bind("p1", "node-a")
    assert "no placement of default/p1 on node-a is known" in answer["Error"]
    assert "retry" in answer["Error"]
    assert "nodeName" not in harness.cluster.get("pods", "p1", "default")["spec"]
    assert LOCK_ANNOTATION not in (meta(harness.cluster.get("nodes", "node-a")).get("annotations") or {})
    harness.filter("p1")
    assert harness.bind("p1", "node-a") == {"Error": ""}


def _used_memory(h: Harness, node: str) -> list[int]:
    assert h.service is not None
    return [usedmem for _, usedmem, _ in next(iter(h.service.state.usage_snapshot()[node].values())).values()]


def test_a_view_of_the_pod_older_than_its_decision_does_not_free_the_decided_devices(harness: Harness) -> None:
    """A watch event taken before the filter's write (kube-scheduler's status updates of a pod it retries reach
    the scheduler late, above all after a restart) must not replace the decision counted for the pod: counted,
    it freed the card for the next pod, and a card of 16384 MiB held three pods of 6000 MiB."""
    harness.add_node(gpu_node("node-a", gpus=1, memory=16384))
    harness.add_node(gpu_node("node-b", gpus=1, memory=16384))
    for name in ("p1", "p2", "p3"):
        harness.add_pod(gpu_pod(name, mem=6000))
    harness.start()
    assert harness.service is not None
    harness.flush()
    before = harness.cluster.get("pods", "p1", "default")  # no decision on it yet
    assert harness.filter("p1", nodes=["node-a"])["NodeNames"] == ["node-a"]
    harness.flush()
    harness.service._on_pod(WatchEvent("MODIFIED", before))  # delivered late
    assert _used_memory(harness, "node-a") == [6000]
    assert harness.filter("p2", nodes=["node-a"])["NodeNames"] == ["node-a"]
    answer = harness.filter("p3", nodes=["node-a"])
    assert answer["NodeNames"] == [], "the card holds two pods of 6000 MiB, not three"

    # A pod placed again (its earlier decision, on node-b, is still on it): a late view carrying that earlier
    # decision counts neither it nor less than the new one.
    harness.cluster.patch_metadata("pods", "p3", "default", annotations=annotations(harness, "p2") | {
        "hami.io/vgpu-node": "node-b",
        "hami.io/vgpu-devices-allocated": "GPU-node-b-0,NVIDIA,6000,0:;",
        "hami.io/vgpu-devices-to-allocate": "GPU-node-b-0,NVIDIA,6000,0:;",
    })  # fmt: skip
    harness.flush()
    earlier = harness.cluster.get("pods", "p3", "default")
    assert _used_memory(harness, "node-b") == [6000]
    assert harness.filter("p3", nodes=["node-b"])["NodeNames"] == ["node-b"]
    harness.flush()
    harness.service._on_pod(WatchEvent("MODIFIED", earlier))
    assert _used_memory(harness, "node-b") == [6000]

    # Views newer than the write count as they stand: the pod's end frees its devices.
    done = harness.cluster.get("pods", "p1", "default")
    done["status"] = {"phase": "Succeeded"}
    harness.service._on_pod(WatchEvent("MODIFIED", done))
    assert _used_memory(harness, "node-a") == [6000]


def test_a_burst_passes_over_a_node_whose_decision_awaits_its_allocate_while_another_fits() -> None:
    # binpack sends every pod of a burst to the fullest node; each bind there waits for the previous pod's Allocate
    # to free the node lock. With passOverNodesInFlight the next pod goes to the next node in the policy's order.
    h = Harness(ExtenderSettings(bind_lock_wait_seconds=0.5, pass_over_nodes_in_flight=True))
    try:
        for name in ("node-a", "node-b", "node-c"):
            h.add_node(gpu_node(name, gpus=2, memory=8000))
        for name in ("first", "second", "third", "fourth", "big", "fifth"):
            h.add_pod(gpu_pod(name, mem=7000 if name == "big" else 1000))
        h.start()
        first = h.filter("first")["NodeNames"][0]
        second = h.filter("second")["NodeNames"][0]
        assert second != first  # first's decision is not allocated yet
        h.flush()
        assert h.bind("first", first) == {"Error": ""}  # bound, Allocate not yet answered: still in flight
        h.flush()
        third = h.filter("third")["NodeNames"][0]
        assert third not in (first, second)
        h.cluster.patch_metadata("pods", "first", "default", annotations={BIND_PHASE: "success"})
        h.flush()
        # allocated: binpack's order again (its lock, not yet released by the node side, is the next bind's)
        assert h.filter("fourth")["NodeNames"] == [first]
        # every node has one decision in flight now: the policy's order decides among them
        assert h.filter("big")["NodeNames"] == [first]
        # and among nodes with queues of different lengths, the shortest: first has two pods waiting now
        assert h.filter("fifth")["NodeNames"][0] in (second, third)
    finally:
        h.stop()


def test_without_pass_over_binpack_sends_the_burst_to_one_node(harness: Harness) -> None:
    for name in ("node-a", "node-b"):
        harness.add_node(gpu_node(name, gpus=2, memory=8000))
    for name in ("first", "second"):
        harness.add_pod(gpu_pod(name, mem=1000))
    harness.start()
    assert harness.filter("first")["NodeNames"] == harness.filter("second")["NodeNames"]


class _CountsPodPatches(MemoryCluster):
    """Records every write of a pod's metadata (its annotations): a patch, or a Binding carrying annotations."""

    def __init__(self) -> None:
        super().__init__()
        self.pod_patches: list[dict[str, Any]] = []

    def patch_metadata(self, resource: str, name: str, namespace: str | None = None, **kwargs: Any) -> Any:
        if resource == "pods":
            self.pod_patches.append(dict(kwargs.get("annotations") or {}))
        return super().patch_metadata(resource, name, namespace, **kwargs)  # type: ignore[arg-type]

    def bind(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        if kwargs.get("annotations"):
            self.pod_patches.append(dict(kwargs["annotations"]))
        super().bind(namespace, name, uid, node, **kwargs)


def test_at_bind_the_filter_writes_nothing_and_the_bind_writes_placement_and_phase_in_one_patch() -> None:
    """The one write is the Binding's: kube-apiserver sets its annotations and labels on the pod in the write that
    sets its node, so no view of the pod has the placement without the node or the node without the placement."""
    cluster = _CountsPodPatches()
    views: list[dict[str, Any]] = []
    cluster.watch("pods", cluster.resource_version(), lambda event: views.append(event.object))
    h = Harness(AT_BIND, cluster=cluster)
    try:
        h.add_node(gpu_node("node-a", gpus=1))
        h.add_pod(gpu_pod("p1", mem=3000, cores=30))
        h.start()
        assert h.filter("p1")["NodeNames"] == ["node-a"]
        assert cluster.pod_patches == []
        assert "hami.io/vgpu-node" not in annotations(h, "p1")
        assert h.bind("p1", "node-a") == {"Error": ""}
        assert len(cluster.pod_patches) == 1, "placement and bind phase: one write"
        (patch,) = cluster.pod_patches
        assert patch[BIND_PHASE] == "allocating"
        assert patch["hami.io/vgpu-devices-to-allocate"] == "GPU-node-a-0,NVIDIA,3000,30:;"
        assert patch["hami.io/vgpu-node"] == "node-a"
        assert h.cluster.get("pods", "p1", "default")["spec"]["nodeName"] == "node-a"
        h.flush()
        assert h.service is not None
        assert h.service.state.pods["default/p1"].bound
        (bound,) = [v for v in views if (v.get("spec") or {}).get("nodeName")]
        assert meta(bound)["annotations"]["hami.io/vgpu-devices-to-allocate"] == "GPU-node-a-0,NVIDIA,3000,30:;"
        assert meta(bound)["labels"]["hami.io/vgpu-node"] == "node-a"
        assert all("hami.io/vgpu-node" not in (meta(v).get("annotations") or {}) for v in views if v is not bound)
    finally:
        h.stop()


def test_an_api_server_that_drops_a_bindings_labels_gets_the_label_patched_and_the_placement_before_binding() -> None:
    """Before 1.35 (or with PodTopologyLabelsAdmission off) kube-apiserver keeps a Binding's annotations but not its
    labels: the scheduler sees the bound pod without its `hami.io/vgpu-node` label, patches it, and from then on
    patches the placement (label included) before the Binding, as HAMi does."""
    cluster = _CountsPodPatches()
    cluster.copies_binding_labels = False
    h = Harness(AT_BIND, cluster=cluster)
    try:
        h.add_node(gpu_node("node-a", gpus=2))
        h.add_pod(gpu_pod("p1", mem=3000))
        h.add_pod(gpu_pod("p2", mem=3000))
        h.start()
        side = FakeNodeSide(cluster)
        assert h.filter("p1")["NodeNames"] == ["node-a"]
        assert h.bind("p1", "node-a") == {"Error": ""}
        h.flush()
        assert meta(h.cluster.get("pods", "p1", "default"))["labels"]["hami.io/vgpu-node"] == "node-a"
        assert h.service is not None
        assert not h.service.extender.binder.binding_copies_labels
        assert side.served == ["p1"]
        written = len(cluster.pod_patches)
        assert h.filter("p2")["NodeNames"] == ["node-a"]
        assert h.bind("p2", "node-a") == {"Error": ""}
        assert cluster.pod_patches[written][BIND_PHASE] == "allocating"  # the placement patched, then bound
        assert meta(h.cluster.get("pods", "p2", "default"))["labels"]["hami.io/vgpu-node"] == "node-a"
        assert meta(h.cluster.get("pods", "p2", "default"))["annotations"]["hami.io/vgpu-node"] == "node-a"
    finally:
        h.stop()


def _threads_deciding(h: Harness) -> list[str]:
    """The names of the threads the extender's filter runs on, from now on."""
    assert h.service is not None
    extender = h.service.extender
    names: list[str] = []
    decide = extender.filter

    def recorded(pod_obj: Any, node_names: Any, nodes: Any = None) -> Any:
        names.append(threading.current_thread().name)
        return decide(pod_obj, node_names, nodes)

    extender.filter = recorded  # type: ignore[method-assign]
    return names


def test_a_filter_that_waits_on_nothing_is_decided_on_the_servers_loop_and_any_other_in_a_worker() -> None:
    """The loop thread must never wait on the API server or the watch: a first filter of a pod the watch has
    delivered is decided there (no thread hand-offs); a filter again (its earlier placement may need withdrawing
    through the API), a pod the watch has not delivered (waited for) and a body that does not parse go to a
    worker, and every one is answered as before."""
    h = Harness(AT_BIND)
    try:
        h.add_node(gpu_node("node-a"))
        h.add_pod(gpu_pod("p1"))
        h.start()
        threads = _threads_deciding(h)
        assert h.filter("p1")["NodeNames"] == ["node-a"]
        assert h.filter("p1")["NodeNames"] == ["node-a"]
        pod = h.cluster.get("pods", "p1", "default")
        stranger = {**pod, "metadata": {**meta(pod), "name": "p2", "uid": "uid-never-created"}}
        status, answer = h.post("filter", {"Pod": stranger, "NodeNames": ["node-a"]})
        assert status == 200
        assert "not known to this scheduler's watch" in answer["Error"]
        assert threads[0] == "extender-http"
        assert [t.startswith("extender-work") for t in threads[1:]] == [True, True]
        status, answer = h.post("filter", None, raw=b'{"Pod": {"metadata": {"name": "Not A Name"}}}')
        assert status == 400
        assert "Pod.metadata.name" in answer["Error"]
    finally:
        h.stop()


def test_without_record_at_bind_every_filter_is_decided_in_a_worker() -> None:
    """Its filter writes the placement through the API, which the server's loop must not wait for."""
    h = Harness()
    try:
        h.add_node(gpu_node("node-a"))
        h.add_pod(gpu_pod("p1"))
        h.start()
        threads = _threads_deciding(h)
        assert h.filter("p1")["NodeNames"] == ["node-a"]
        assert len(threads) == 1
        assert threads[0].startswith("extender-work")
    finally:
        h.stop()


def test_at_bind_a_decision_not_carried_out_costs_no_write_and_frees_its_devices() -> None:
    """Filtered again, bound elsewhere than decided, refused by a busy node or deleted: the decision is taken
    back in memory; nothing was written, so nothing is withdrawn from the pod."""
    cluster = _CountsPodPatches()
    h = Harness(ExtenderSettings(bind_lock_wait_seconds=0.2, record_at_bind=True), cluster=cluster)
    try:
        h.add_node(gpu_node("node-a", gpus=1, memory=8000))
        h.add_node(gpu_node("node-b", gpus=1, memory=8000))
        for name in ("p1", "p2", "p3"):
            h.add_pod(gpu_pod(name, mem=6000))
        h.start()
        assert h.service is not None
        state, extender = h.service.state, h.service.extender
        assert h.filter("p1", nodes=["node-a"])["NodeNames"] == ["node-a"]
        assert h.filter("p1", nodes=["node-a"])["NodeNames"] == ["node-a"]  # again: the first decision is withdrawn
        assert cluster.pod_patches == []
        # bound elsewhere than decided: refused, and the devices are free again
        answer = h.bind("p1", "node-b")
        assert "no placement of default/p1 on node-b is known" in answer["Error"]
        assert "default/p1" not in state.pods
        assert h.filter("p2", nodes=["node-a"])["NodeNames"] == ["node-a"]
        # a node locked by a live pod: the bind waits, is refused, and its decision no longer holds the card
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        h.cluster.patch_metadata("nodes", "node-a", annotations={LOCK_ANNOTATION: f"{now},default,p3"})
        h.flush()
        assert "locked by pod default/p3" in h.bind("p2", "node-a")["Error"]
        assert "default/p2" not in state.pods
        # deleted between filter and bind: forgotten
        h.cluster.patch_metadata("nodes", "node-a", annotations={LOCK_ANNOTATION: None})
        assert h.filter("p3", nodes=["node-b"])["NodeNames"] == ["node-b"]
        h.cluster.delete("pods", "p3", "default")
        h.flush()
        assert "default/p3" not in state.pods
        assert extender.pending._decisions == {}
        assert cluster.pod_patches == []
    finally:
        h.stop()


def test_the_quota_ledger_counts_from_the_schedulers_own_pod_watch(harness: Harness) -> None:
    """One list and one watch of pods in the scheduler: the ledger learns of a pod's end from the service's."""
    harness.cluster.create(
        "resourcequotas",
        {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}},
        },
    )
    harness.add_node(gpu_node("node-a", gpus=2))
    harness.add_pod(gpu_pod("p1", mem=6000))
    harness.add_pod(gpu_pod("p2", mem=6000))
    harness.start()
    assert harness.service is not None
    watched = [s for s in harness.cluster._subs if s.resource == "pods"]
    assert harness.schedule("p1") == "node-a"
    harness.flush()
    assert harness.filter("p2")["NodeNames"] == []  # 12000 MiB would pass the namespace's 8000
    harness.cluster.delete("pods", "p1", "default")
    harness.flush()
    assert harness.filter("p2")["NodeNames"] == ["node-a"]
    assert len(watched) == 1


def test_until_the_state_is_synced_filter_and_bind_answer_that_it_is_still_reading() -> None:
    """`hami scheduler` starts its listeners while it reads the cluster: a decision on a half-built state could
    double-book, so kube-scheduler is asked to retry."""
    from hami.plugins import VendorPlugins
    from hami.scheduler.service import SchedulerService

    cluster = MemoryCluster()
    cluster.create("nodes", gpu_node("node-a"))
    pod = cluster.create("pods", gpu_pod("p1"))
    service = SchedulerService(cluster, VendorPlugins.load(), placement_keys=None)
    result = service.extender.filter(pod, ["node-a"])
    assert result.node is None
    assert "still reading the cluster" in result.error
    assert "still reading the cluster" in service.extender.bind("default", "p1", meta(pod)["uid"], "node-a").error
    service.start()
    try:
        assert service.extender.filter(pod, ["node-a"]).node == "node-a"
    finally:
        service.stop()


def test_the_states_totals_are_the_sums_over_every_device(harness: Harness) -> None:
    """`ClusterState.totals` (the hosted dashboard's history) reads the per-node totals kept with every change:
    they must equal what the devices themselves say."""
    harness.add_node(gpu_node("node-a", gpus=3, memory=16000, split=10))
    harness.add_node(gpu_node("node-b", gpus=2))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    for i in range(6):
        harness.add_pod(gpu_pod(f"p{i}", gpu=1 + i % 2, mem=700 + 100 * i, cores=5 * (i % 3)))
        assert harness.schedule(f"p{i}")
    harness.cluster.delete("pods", "p2", "default")
    harness.flush()
    assert harness.service is not None
    state = harness.service.state
    devices = [u for r in state.nodes.values() for v in r.views.values() for u in v.devices]
    expected = (
        sum(u.usedmem for u in devices),
        sum(u.device.devmem for u in devices),
        sum(u.usedcores for u in devices),
        sum(u.device.devcore for u in devices),
        len(state.pods),
    )
    assert state.totals() == expected
    assert expected[0] > 0
    node_side.stop()
