"""Preemption through the scheduler service on an in-memory cluster (`hami.scheduler.preempting`): the victims are
evicted through the Eviction API with Events naming each other, the room they free is held for the preemptor
(no other pod takes it, a restart keeps it and evicts nobody twice), then the preemptor is filtered and bound."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from scheduler_harness import Harness, gpu_node, gpu_pod, running_pod

from hami.cluster import MemoryCluster, NotFoundError, meta
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.holds import HOLD_ANNOTATION
from hami.status import render_status, status_of

GIB = 1024


def settings(**changes: Any) -> ExtenderSettings:
    values: dict[str, Any] = {"bind_lock_wait_seconds": 0.5, "preemption_enabled": True, "preemption_hold_seconds": 60}
    return ExtenderSettings(**{**values, **changes})


def urgent(name: str = "urgent", mem: int = 8 * GIB, priority: int = 1000, **spec: Any) -> dict[str, Any]:
    pod = gpu_pod(name, mem=mem)
    pod["spec"].update(priority=priority, **spec)
    return pod


def full_node(cluster: MemoryCluster) -> None:
    """n1: two 16 GiB cards, card 0 holding 8 + 4 + 4 GiB, card 1 4 + 4 + 4 + 4 GiB, all at priority 10."""
    cluster.create("nodes", gpu_node("n1", gpus=2))
    for name, card, gib in [("a", 0, 8), ("b", 0, 4), ("c", 0, 4), ("d", 1, 4), ("e", 1, 4), ("f", 1, 4), ("g", 1, 4)]:
        cluster.create("pods", running_pod(name, "n1", {card: gib * GIB}, priority=10))


@pytest.fixture
def h() -> Iterator[Harness]:
    cluster = MemoryCluster()
    full_node(cluster)
    harness = Harness(settings(), cluster).start()
    yield harness
    harness.stop()


def preempt(h: Harness, name: str) -> dict[str, Any]:
    """A filter, and the preemption it started carried out."""
    answer = h.filter(name)
    assert h.service is not None
    assert h.service.extender.preempting is not None
    h.service.extender.preempting.settle()
    return answer


def names(cluster: MemoryCluster) -> set[str]:
    return {meta(p)["name"] for p in cluster.list("pods")[0]}


def events(cluster: MemoryCluster, reason: str) -> dict[str, str]:
    return {e["involvedObject"]["name"]: e["message"] for e in cluster.events if e["reason"] == reason}


def test_a_high_priority_pod_evicts_the_fewest_pods_on_one_card_and_runs_there(h: Harness) -> None:
    h.add_pod(urgent())
    first = preempt(h, "urgent")
    assert first["NodeNames"] == []
    assert "preempting: evicting 1 lower-priority pod(s)" in first["FailedNodes"]["n1"]
    assert names(h.cluster) == {"b", "c", "d", "e", "f", "g", "urgent"}  # a (8 GiB) leaves card 0; card 1 needs two
    assert "default/urgent" in events(h.cluster, "Preempted")["a"]
    assert "default/a" in events(h.cluster, "Preempting")["urgent"]
    hold = json.loads(meta(h.cluster.get("pods", "urgent"))["annotations"][HOLD_ANNOTATION])
    assert hold["node"] == "n1"
    assert [v["pod"] for v in hold["victims"]] == ["default/a"]
    h.flush()
    assert h.schedule("urgent") == "n1"
    allocated = meta(h.cluster.get("pods", "urgent"))["annotations"]["hami.io/vgpu-devices-allocated"]
    assert allocated.startswith("GPU-n1-0,")
    assert h.service is not None
    assert h.service.metrics.preemptions.labels(result="evicted")._value.get() == 1
    assert h.service.metrics.preemption_victims._value.get() == 1


def test_a_smaller_pod_arriving_meanwhile_does_not_take_the_held_room(h: Harness) -> None:
    h.add_pod(urgent())
    preempt(h, "urgent")
    h.flush()
    h.add_pod(gpu_pod("sneaky", mem=4 * GIB))  # would fit where `a` was, but for the hold
    assert h.filter("sneaky")["NodeNames"] == []
    assert h.schedule("urgent") == "n1"


def test_a_restarted_scheduler_keeps_the_hold_and_evicts_nobody_twice(h: Harness) -> None:
    h.add_pod(urgent())
    preempt(h, "urgent")
    h.flush()
    h.restart()
    h.add_pod(gpu_pod("sneaky", mem=4 * GIB))
    assert h.filter("sneaky")["NodeNames"] == []
    assert names(h.cluster) == {"b", "c", "d", "e", "f", "g", "urgent", "sneaky"}
    assert h.schedule("urgent") == "n1"
    assert len(events(h.cluster, "Preempted")) == 1


def test_the_preemptor_waits_for_its_victims_without_preempting_again() -> None:
    cluster = MemoryCluster()
    full_node(cluster)
    h = Harness(settings(), cluster).start()
    try:
        evicted: list[str] = []
        real = cluster.evict
        cluster.evict = lambda namespace, name, uid="": evicted.append(name)  # type: ignore[method-assign]
        h.add_pod(urgent())
        preempt(h, "urgent")
        again = preempt(h, "urgent")  # the victim has not left yet
        assert again["NodeNames"] == []
        assert "1 of 1 evicted pods still hold" in again["FailedNodes"]["n1"]
        assert evicted == ["a"]
        real("default", "a")
        h.flush()
        assert h.schedule("urgent") == "n1"
    finally:
        h.stop()


def test_an_expired_hold_frees_the_room() -> None:
    cluster = MemoryCluster()
    full_node(cluster)
    h = Harness(settings(preemption_hold_seconds=0.01), cluster).start()
    try:
        h.add_pod(urgent())
        preempt(h, "urgent")
        h.flush()
        time.sleep(0.05)
        h.add_pod(gpu_pod("later", mem=4 * GIB))
        assert h.schedule("later") == "n1"
    finally:
        h.stop()


def test_preemption_policy_never_evicts_nobody(h: Harness) -> None:
    h.add_pod(urgent(preemptionPolicy="Never"))
    assert preempt(h, "urgent")["NodeNames"] == []
    assert len(names(h.cluster)) == 8
    assert not events(h.cluster, "Preempted")


def test_a_pod_of_equal_priority_is_not_preempted(h: Harness) -> None:
    h.add_pod(urgent(priority=10))
    assert preempt(h, "urgent")["NodeNames"] == []
    assert len(names(h.cluster)) == 8


def test_a_budget_that_forbids_the_eviction_is_honoured() -> None:
    cluster = MemoryCluster()
    full_node(cluster)
    for pod in cluster.list("pods")[0]:
        cluster.patch_metadata("pods", meta(pod)["name"], "default", labels={"app": "batch"})
    cluster.create(
        "poddisruptionbudgets",
        {
            "metadata": {"name": "batch", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "batch"}}, "maxUnavailable": 0},
            "status": {"disruptionsAllowed": 0},
        },
    )
    h = Harness(settings(), cluster).start()
    try:
        h.add_pod(urgent())
        assert preempt(h, "urgent")["NodeNames"] == []
        assert len(names(cluster)) == 8
        assert HOLD_ANNOTATION not in meta(cluster.get("pods", "urgent"))["annotations"]
    finally:
        h.stop()


def test_the_eviction_api_refuses_what_a_budget_forbids() -> None:
    cluster = MemoryCluster()
    cluster.create("pods", {"metadata": {"name": "db", "labels": {"app": "db"}}, "spec": {}})
    cluster.create(
        "poddisruptionbudgets",
        {"metadata": {"name": "db"}, "spec": {"selector": {"matchLabels": {"app": "db"}}}, "status": {}},
    )
    with pytest.raises(Exception, match="disruption budget db") as refused:
        cluster.evict("default", "db")
    assert getattr(refused.value, "status", 0) == 429
    with pytest.raises(NotFoundError):
        cluster.evict("default", "db", uid="another")


def test_dry_run_only_records_what_it_would_evict() -> None:
    cluster = MemoryCluster()
    full_node(cluster)
    h = Harness(settings(preemption_dry_run=True), cluster).start()
    try:
        h.add_pod(urgent())
        preempt(h, "urgent")
        preempt(h, "urgent")
        assert len(names(cluster)) == 8
        assert list(events(cluster, "PreemptionDryRun")) == ["urgent"]
        assert "would evict default/a" in events(cluster, "PreemptionDryRun")["urgent"]
        assert sum(1 for e in cluster.events if e["reason"] == "PreemptionDryRun") == 1
        assert h.service is not None
        assert h.service.extender.preempting is not None
        assert h.service.extender.preempting.holds.holds == {}  # nothing is held in a dry run
        assert HOLD_ANNOTATION not in meta(cluster.get("pods", "urgent"))["annotations"]
        assert h.service.metrics.preemptions.labels(result="dry_run")._value.get() == 1
    finally:
        h.stop()


def test_the_preempt_verb_gives_kube_scheduler_no_candidate_while_hami_preempts(h: Harness) -> None:
    body = {"Pod": urgent(), "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}}
    assert h.post("preempt", body) == (200, {"NodeNameToMetaVictims": {}})
    assert h.post("preempt", None, raw=b"[1")[0] == 400


def test_with_preemption_off_the_preempt_verb_returns_kube_schedulers_candidates() -> None:
    h = Harness().start()
    try:
        victims = {"n1": {"Pods": [{"UID": "uid-a"}], "NumPDBViolations": 0}}
        assert h.post("preempt", {"NodeNameToMetaVictims": victims}) == (200, {"NodeNameToMetaVictims": victims})
    finally:
        h.stop()


def test_hami_status_shows_the_hold_and_counts_its_room() -> None:
    cluster = MemoryCluster()
    full_node(cluster)
    h = Harness(settings(), cluster).start()
    try:
        cluster.evict = lambda namespace, name, uid="": None  # type: ignore[method-assign]  # victims slow to go
        h.add_pod(urgent())
        preempt(h, "urgent")
        status = status_of(cluster.list("nodes")[0], cluster.list("pods")[0], h.plugins)
        (hold,) = status.holds
        assert (hold.node, hold.victims, hold.leaving, hold.memory) == ("n1", ("default/a",), ("default/a",), 8 * GIB)
        card = status.device("GPU-n1-0")
        assert card is not None
        assert card.memory_used == 24 * GIB  # a, b, c and the held 8 GiB until a has gone
        assert "held on n1 for default/urgent: 8192 MiB" in render_status(status)
    finally:
        h.stop()
