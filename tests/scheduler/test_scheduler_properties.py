"""Properties of the scheduler that must hold whatever the workload: no over-booking, same state after restart,
init containers counted as HAMi counts them, and a protocol surface that answers anything without crashing."""

from __future__ import annotations

import json
import threading
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.codec import decode_node_register, decode_pod_devices
from hami.front import Raw
from hami.model import ContainerDevice, RunOrder
from hami.scheduler.server import ExtenderApp
from hami.scheduler.state import effective_grants

pod_shapes = st.tuples(st.integers(1, 3), st.integers(0, 12000), st.integers(0, 100))


def booked(h: Harness) -> dict[str, list[int]]:
    """device → [containers, MiB, cores] summed from every pod's allocated annotation (init rule applied)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in h.cluster.list("pods")[0]:
        value = (meta(pod).get("annotations") or {}).get("hami.io/vgpu-devices-allocated")
        if not value:
            continue
        order = RunOrder.of_spec(pod["spec"])
        for uuid, grant in effective_grants({"NVIDIA": decode_pod_devices(value)}, order)["NVIDIA"].items():
            totals[uuid][0] += grant.slots
            totals[uuid][1] += grant.memory
            totals[uuid][2] += grant.cores
    return totals


def assert_within_capacity(h: Harness) -> None:
    for node in h.cluster.list("nodes")[0]:
        for device in decode_node_register(meta(node)["annotations"]["hami.io/node-nvidia-register"]):
            used, memory, cores = booked(h)[device.id]
            assert used <= device.count, device.id
            assert memory <= device.devmem, device.id
            assert cores <= device.devcore, device.id


def assert_free_by_model_is_current(h: Harness) -> None:
    """The incrementally kept free share per device model equals a recount over every node."""
    assert h.service is not None
    state = h.service.state
    recount: dict[str, dict[str, int]] = {}
    for record in state.nodes.values():
        for kind, totals in record.totals.items():
            models = recount.setdefault(kind, {})
            models[totals.model] = models.get(totals.model, 0) + sum(state.signature(record, kind))
    kept = {kind: {m: v for m, v in models.items() if v} for kind, models in state.free_by_model.items()}
    assert kept == {kind: {m: v for m, v in models.items() if v} for kind, models in recount.items()}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.lists(pod_shapes, min_size=5, max_size=40), threads=st.integers(2, 6))
def test_concurrent_filters_never_hand_out_more_than_a_device_has(
    shapes: list[tuple[int, int, int]], threads: int
) -> None:
    h = Harness()
    for name in ("n1", "n2"):
        h.add_node(gpu_node(name, gpus=3, memory=24000, split=4))
    for i, (gpu, mem, cores) in enumerate(shapes):
        h.add_pod(gpu_pod(f"p{i}", gpu=gpu, mem=mem or None, cores=cores))
    h.start()
    assert h.service is not None
    extender = h.service.extender
    names = ["n1", "n2"]
    pods = [h.cluster.get("pods", f"p{i}", "default") for i in range(len(shapes))]

    def worker(part: list[dict[str, object]]) -> None:
        for pod in part:
            extender.filter(pod, names)

    workers = [threading.Thread(target=worker, args=(pods[i::threads],)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    h.flush()
    assert_within_capacity(h)
    assert_free_by_model_is_current(h)
    h.stop()


def test_restart_after_a_random_workload_rebuilds_the_same_usage() -> None:
    h = Harness()
    h.add_node(gpu_node("n1", gpus=4, memory=16000, split=5))
    h.start()
    for i in range(25):
        h.add_pod(gpu_pod(f"p{i}", gpu=1 + i % 3, mem=500 + 97 * i, cores=(7 * i) % 40))
        h.filter(f"p{i}")
    h.cluster.delete("pods", "p3", "default")
    h.cluster.patch_metadata("pods", "p4", "default", annotations={"hami.io/bind-phase": "failed"})
    h.cluster.replace("pods", {**h.cluster.get("pods", "p5", "default"), "status": {"phase": "Succeeded"}})
    h.add_node(gpu_node("n2", gpus=2, memory=8000, split=2))
    h.filter("p6")
    h.cluster.replace("nodes", gpu_node("n2", gpus=3, memory=8000, split=2))  # its devices change under its pods
    h.flush()
    assert_free_by_model_is_current(h)
    assert h.service is not None
    before = h.service.state.usage_snapshot()
    free = h.service.state.free_by_model
    h.restart()
    assert h.service.state.usage_snapshot() == before
    assert h.service.state.free_by_model == free
    assert_free_by_model_is_current(h)
    h.cluster.delete("nodes", "n2")
    h.flush()
    assert_free_by_model_is_current(h)
    h.stop()


def test_init_containers_count_as_their_peak_against_the_sum_of_app_containers() -> None:
    dev = "GPU-x"
    placements = (
        (ContainerDevice(uuid=dev, type="NVIDIA", usedmem=6000, usedcores=50),),  # init 1
        (ContainerDevice(uuid=dev, type="NVIDIA", usedmem=2000, usedcores=70),),  # init 2
        (ContainerDevice(uuid=dev, type="NVIDIA", usedmem=1000, usedcores=10),),  # app 1
        (ContainerDevice(uuid=dev, type="NVIDIA", usedmem=1500, usedcores=10),),  # app 2
    )
    grant = effective_grants({"NVIDIA": placements}, RunOrder(init=2))["NVIDIA"][dev]
    assert (grant.slots, grant.memory, grant.cores) == (2, 6000, 70)


def test_succeeded_and_deleted_pods_free_their_usage(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1, memory=8000))
    harness.add_pod(gpu_pod("a", mem=6000))
    harness.add_pod(gpu_pod("b", mem=6000))
    harness.start()
    assert harness.filter("a")["NodeNames"] == ["n1"]
    assert harness.filter("b")["NodeNames"] == []
    harness.flush()
    harness.cluster.replace("pods", {**harness.cluster.get("pods", "a", "default"), "status": {"phase": "Succeeded"}})
    harness.flush()
    assert harness.filter("b")["NodeNames"] == ["n1"]


request_bodies = st.one_of(
    st.binary(max_size=200),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(st.text(max_size=12), children, max_size=4)
        ),
        max_leaves=20,
    ).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {
            "Pod": st.one_of(st.none(), st.just({"metadata": {"name": "p"}}), st.dictionaries(st.text(), st.text())),
            "NodeNames": st.one_of(st.none(), st.lists(st.text(max_size=8), max_size=3), st.text()),
            "Nodes": st.one_of(st.none(), st.just({"items": [{}]}), st.just({"items": "x"})),
            "PodName": st.one_of(st.none(), st.text(max_size=5)),
            "Node": st.one_of(st.none(), st.integers()),
        }
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(verb=st.sampled_from(["filter", "bind", "prioritize", "nope", "filter/extra"]), body=request_bodies)
def test_any_body_gets_an_answer_never_a_crash(verb: str, body: bytes, harness: Harness) -> None:
    if harness.service is None:
        harness.add_node(gpu_node("n1", gpus=1))
        harness.start()
    assert harness.service is not None
    app = ExtenderApp(harness.service.extender)
    status, payload = app.handle("POST", f"/{verb}", body)
    assert status in (200, 400, 404)
    if isinstance(payload, Raw):  # an answer encoded by the app itself (the full-Nodes form's) is JSON too
        payload = json.loads(payload.body)
    json.dumps(payload)
    if status != 200:
        assert payload["Error"]


def test_two_replicas_only_the_leader_decides_and_a_successor_sees_its_decisions() -> None:
    from hami.config import LeaderElectionConfig
    from hami.scheduler.extender import ExtenderSettings
    from hami.scheduler.service import SchedulerService

    first = Harness()
    first.add_node(gpu_node("n1", gpus=2, memory=10000, split=2))
    for i in range(8):
        first.add_pod(gpu_pod(f"p{i}", mem=4000))
    election = LeaderElectionConfig(enabled=True, namespace="kube-system", lease_duration_seconds=0.75)
    replicas = [
        SchedulerService(first.cluster, first.plugins, ExtenderSettings(), election, identity=f"replica-{i}").start()
        for i in range(2)
    ]
    try:
        leader = _wait_for_leader(replicas)
        follower = replicas[1 - replicas.index(leader)]
        pods = [first.cluster.get("pods", f"p{i}", "default") for i in range(8)]
        assert "not the leader" in follower.extender.filter(pods[0], ["n1"]).error
        placed = [leader.extender.filter(p, ["n1"]).node for p in pods[:3]]
        assert placed == ["n1", "n1", "n1"]
        first.flush()
        leader.stop()  # hands the lease over at once
        successor = _wait_for_leader([follower])
        outcomes = [successor.extender.filter(p, ["n1"]).node for p in pods[3:]]
        assert outcomes == ["n1", None, None, None, None]  # 2 cards × 2 slots; 4000 MiB twice per 10000 MiB card
        first.flush()
        assert_within_capacity(first)
    finally:
        for replica in replicas:
            replica.stop()


def _wait_for_leader(replicas: list[object]) -> object:
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for replica in replicas:
            if replica.elector.is_leader:  # type: ignore[attr-defined]
                return replica
        time.sleep(0.02)
    raise AssertionError("no replica became leader within 5 s")
