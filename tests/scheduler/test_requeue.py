"""A pod refused in the instant before capacity freed is retried: `hami.scheduler.requeue`, alone and in the service."""

from __future__ import annotations

import time
from collections.abc import Callable

from scheduler_harness import FakeNodeSide, Harness, gpu_node, gpu_pod

from hami.cluster import MemoryCluster, meta
from hami.scheduler.requeue import REQUEUE_ANNOTATION, Requeuer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _cluster(*names: str) -> MemoryCluster:
    cluster = MemoryCluster()
    for name in names:
        cluster.create("pods", gpu_pod(name))
    return cluster


def _counted(requeuer: Requeuer) -> list[None]:
    """One entry per nudge `requeuer` writes (what the service counts in `hami_scheduler_requeues_total`)."""
    nudges: list[None] = []
    requeuer.on_nudge = lambda: nudges.append(None)
    return nudges


def _stamped(cluster: MemoryCluster, name: str) -> bool:
    return REQUEUE_ANNOTATION in (meta(cluster.get("pods", name, "default")).get("annotations") or {})


def test_a_refusal_from_a_view_without_the_free_is_nudged_once() -> None:
    cluster, clock = _cluster("p"), Clock()
    requeuer = Requeuer(cluster, clock=clock)
    nudges = _counted(requeuer)
    requeuer.refused("default", "p", frees=3, started=clock.now)
    clock.now += 0.2
    requeuer.capacity_freed(4)
    requeuer.capacity_freed(5)  # a second free: the refusal was nudged already
    requeuer.stop()
    assert _stamped(cluster, "p")
    assert len(nudges) == 1


def test_a_refusal_that_saw_every_free_applied_is_left_to_kube_scheduler() -> None:
    """Refused with the free already in its view: the pod does not fit, and a retry would not change that."""
    cluster, clock = _cluster("p"), Clock()
    requeuer = Requeuer(cluster, clock=clock)
    nudges = _counted(requeuer)
    requeuer.capacity_freed(4)
    requeuer.refused("default", "p", frees=4, started=clock.now)
    requeuer.capacity_freed(4)  # an event that freed nothing
    requeuer.stop()
    assert not _stamped(cluster, "p")
    assert nudges == []


def test_a_free_applied_while_the_filter_decided_nudges_at_once() -> None:
    """The watch applied the free between the filter's read of the count and its report of the refusal."""
    cluster, clock = _cluster("p"), Clock()
    requeuer = Requeuer(cluster, clock=clock)
    requeuer.capacity_freed(7)
    requeuer.refused("default", "p", frees=6, started=clock.now)
    requeuer.stop()
    assert _stamped(cluster, "p")


def test_a_refusal_older_than_the_window_and_a_placed_pod_are_not_nudged() -> None:
    """kube-scheduler saw the free after such an attempt and retries the pod itself."""
    cluster, clock = _cluster("old", "placed"), Clock()
    requeuer = Requeuer(cluster, window=2.0, clock=clock)
    requeuer.refused("default", "old", frees=1, started=clock.now)
    clock.now += 1.0
    requeuer.refused("default", "placed", frees=1, started=clock.now)
    requeuer.placed("default", "placed")
    clock.now += 1.5
    requeuer.capacity_freed(2)
    requeuer.stop()
    assert not _stamped(cluster, "old")
    assert not _stamped(cluster, "placed")


def test_nudges_are_rate_bounded_newest_first() -> None:
    names = [f"p{i}" for i in range(30)]
    cluster, clock = _cluster(*names), Clock()
    requeuer = Requeuer(cluster, rate=10, clock=clock)
    for i, name in enumerate(names):
        requeuer.refused("default", name, frees=0, started=clock.now + i * 0.01)
    clock.now += 0.5
    requeuer.capacity_freed(1)
    requeuer.stop()
    assert [n for n in names if _stamped(cluster, n)] == names[20:]


def test_a_follower_writes_no_nudge_and_a_deleted_pod_is_no_error() -> None:
    cluster, clock = _cluster("p"), Clock()
    follower = Requeuer(cluster, is_leader=lambda: False, clock=clock)
    follower.refused("default", "p", frees=0, started=clock.now)
    follower.capacity_freed(1)
    follower.stop()
    assert not _stamped(cluster, "p")
    leader = Requeuer(cluster, clock=clock)
    nudges = _counted(leader)
    leader.refused("default", "gone", frees=0, started=clock.now)
    leader.capacity_freed(1)
    leader.stop()
    assert nudges == []


def _wait_for(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_the_service_nudges_a_pod_refused_just_before_a_deletion_freed_its_card(harness: Harness) -> None:
    """The e2e race in miniature: the card is full, the waiting pod is refused, the running pod is deleted; the
    scheduler's watch applies the deletion and asks kube-scheduler (an annotation patch) to retry the refused pod,
    which then fits. A pod refused once the deletion was applied is not nudged."""
    harness.add_node(gpu_node("node-a", gpus=1, memory=16000))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    assert harness.service is not None
    try:
        harness.flush()
        frees = harness.service.state.frees
        harness.add_pod(gpu_pod("big-0", mem=16000))
        assert harness.schedule("big-0") == "node-a"
        harness.flush()
        assert harness.service.state.frees == frees, "a placement and its watch echoes give nothing back"
        harness.add_pod(gpu_pod("big-1", mem=16000))
        harness.add_pod(gpu_pod("late", mem=16000))
        harness.flush()
        assert harness.filter("big-1")["NodeNames"] == []
        harness.cluster.delete("pods", "big-0", "default")
        harness.flush()
        assert _wait_for(lambda: _stamped(harness.cluster, "big-1"))
        assert harness.schedule("big-1") == "node-a"
        harness.flush()
        assert harness.filter("late")["NodeNames"] == []  # refused with every free applied: not nudged
        harness.cluster.patch_metadata("pods", "late", "default", labels={"touched": "yes"})  # frees nothing
        harness.flush()
        harness.service.requeue.stop()
        assert not _stamped(harness.cluster, "late")
        # one nudge, counted in the metric: its own patch freed nothing, so no loop
        assert harness.service.metrics.registry.get_sample_value("hami_scheduler_requeues_total") == 1
    finally:
        node_side.stop()


def test_a_tenant_writing_the_requeue_annotation_gains_nothing(harness: Harness) -> None:
    """A tenant may patch its pod's annotations: the stamp asks for a retry and nothing else; the card stays full."""
    harness.add_node(gpu_node("node-a", gpus=1, memory=16000))
    harness.start()
    node_side = FakeNodeSide(harness.cluster)
    try:
        harness.add_pod(gpu_pod("big-0", mem=16000))
        assert harness.schedule("big-0") == "node-a"
        harness.add_pod(gpu_pod("tenant", mem=16000, annotations={REQUEUE_ANNOTATION: "2026-12-03T00:00:00Z"}))
        harness.flush()
        assert harness.service is not None
        frees = harness.service.state.frees
        harness.cluster.patch_metadata("pods", "tenant", "default", annotations={REQUEUE_ANNOTATION: "again"})
        harness.flush()
        assert harness.service.state.frees == frees
        assert harness.filter("tenant")["NodeNames"] == []
    finally:
        node_side.stop()
