"""Victim selection by device (`hami.scheduler.preemption`): the node and the lower-priority pods whose eviction
makes a pod fit on real devices, in the order of preference its docstring gives."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import gpu_node, gpu_pod, running_pod

from hami.model import Pod, SchedulingPolicy
from hami.plugins import VendorPlugins
from hami.scheduler.preemption import Budget, VictimSelector, without
from hami.scheduler.state import ClusterState

HOST = VendorPlugins.load(disabled=())
POLICY = SchedulingPolicy()


def preemptor(mem: int, priority: int = 1000, gpu: int = 1, **spec: Any) -> Pod:
    obj = gpu_pod("urgent", gpu=gpu, mem=mem)
    obj["metadata"]["uid"] = "uid-urgent"
    obj["spec"].update(priority=priority, **spec)
    return Pod.from_api(obj)


def cluster(nodes: dict[str, int], pods: list[dict[str, Any]], memory: int = 16384) -> ClusterState:
    state = ClusterState(HOST)
    for name, gpus in nodes.items():
        state.set_node(gpu_node(name, gpus=gpus, memory=memory))
    for obj in pods:
        state.set_pod(obj)
    return state


def select(state: ClusterState, pod: Pod, budgets: list[Budget] | None = None) -> tuple[str, list[str]] | None:
    requests = HOST.pod_requests(pod)
    choice = VictimSelector(HOST, state).select(pod, requests, POLICY, sorted(state.nodes), budgets or [])
    if choice is None:
        return None
    return choice.node, [v.key.partition("/")[2] for v in choice.victims]


def fits_without(state: ClusterState, pod: Pod, node: str, keys: list[str]) -> bool:
    requests = HOST.pod_requests(pod)
    view = without(state.nodes[node], "NVIDIA", [state.pods[k] for k in keys])
    return HOST.fit_nodes("NVIDIA", pod, requests["NVIDIA"], [view], POLICY)[0].placement is not None


def test_the_fewest_pods_on_one_card_are_evicted_for_memory_the_node_has_in_free_slots() -> None:
    # every card holds two 8 GiB pods but card 2, which holds three smaller ones and one of 8 GiB
    pods = [running_pod(f"p{i}-{j}", "n1", {i: 8192}, priority=10) for i in range(4) if i != 2 for j in range(2)]
    pods += [running_pod(f"small{j}", "n1", {2: 2048}, priority=10) for j in range(3)]
    pods += [running_pod("big2", "n1", {2: 8192}, priority=10)]
    state = cluster({"n1": 4}, pods)
    # 12 GiB on one card: two pods go from cards 0, 1 or 3, and from card 2 big2 and one small pod
    node, victims = select(state, preemptor(12000))  # type: ignore[misc]
    assert len(victims) == 2
    assert fits_without(state, preemptor(12000), node, [f"default/{v}" for v in victims])


def test_lower_priority_pods_are_chosen_before_higher_ones() -> None:
    pods = [
        running_pod("important", "n1", {0: 16384}, priority=500),
        running_pod("batch", "n1", {1: 16384}, priority=5),
    ]
    assert select(cluster({"n1": 2}, pods), preemptor(10000)) == ("n1", ["batch"])


def test_a_pod_of_equal_or_higher_priority_is_never_a_victim() -> None:
    pods = [running_pod("peer", "n1", {0: 16384}, priority=1000), running_pod("boss", "n1", {1: 16384}, priority=2000)]
    assert select(cluster({"n1": 2}, pods), preemptor(10000, priority=1000)) is None


def test_preemption_policy_never_preempts_nobody() -> None:
    pods = [running_pod("batch", "n1", {0: 16384}, priority=0)]
    assert select(cluster({"n1": 1}, pods), preemptor(10000, preemptionPolicy="Never")) is None


def test_the_youngest_pods_are_evicted_when_priorities_tie() -> None:
    pods = [
        running_pod("old", "n1", {0: 16384}, priority=1, created="2026-01-01T00:00:00Z"),
        running_pod("young", "n1", {1: 16384}, priority=1, created="2026-12-01T00:00:00Z"),
    ]
    assert select(cluster({"n1": 2}, pods), preemptor(10000)) == ("n1", ["young"])


def test_a_budget_with_no_disruption_left_protects_its_pods() -> None:
    pods = [
        running_pod("guarded", "n1", {0: 16384}, priority=1, labels={"app": "db"}, created="2026-12-01T00:00:00Z"),
        running_pod("free", "n1", {1: 16384}, priority=1, created="2026-01-01T00:00:00Z"),
    ]
    budget = Budget("default", "db", {"matchLabels": {"app": "db"}}, allowed=0)
    assert select(cluster({"n1": 2}, pods), preemptor(10000), [budget]) == ("n1", ["free"])
    assert select(cluster({"n1": 1}, pods[:1]), preemptor(10000), [budget]) is None


def test_a_pod_under_a_budget_that_allows_a_disruption_goes_last_among_equals() -> None:
    pods = [
        running_pod("guarded", "n1", {0: 16384}, priority=1, labels={"app": "db"}),
        running_pod("free", "n1", {1: 16384}, priority=1),
    ]
    budget = Budget("default", "db", {"matchLabels": {"app": "db"}}, allowed=1)
    assert select(cluster({"n1": 2}, pods), preemptor(10000), [budget]) == ("n1", ["free"])


def test_a_two_card_pod_frees_two_cards() -> None:
    pods = [running_pod(f"p{i}", "n1", {i: 12000}, priority=i) for i in range(4)]
    assert select(cluster({"n1": 4}, pods), preemptor(8000, gpu=2)) == ("n1", ["p0", "p1"])


def test_a_pod_that_fits_nowhere_even_alone_gets_no_victims() -> None:
    pods = [running_pod("batch", "n1", {0: 8000}, priority=0)]
    assert select(cluster({"n1": 1}, pods), preemptor(20000)) is None


# ---------------------------------------------------------------------------------- properties

shapes = st.lists(
    st.tuples(st.integers(0, 2), st.integers(1, 8), st.integers(0, 3)), min_size=1, max_size=7
)  # (card, GiB, priority) per running pod, on one node of 3 × 16 GiB


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes, st.integers(1, 16), st.integers(1, 4))
def test_the_choice_makes_the_pod_fit_with_no_cheaper_smaller_set_and_no_peer_evicted(
    placed: list[tuple[int, int, int]], asked: int, urgency: int
) -> None:
    pods, used = [], [0, 0, 0]
    for n, (card, gib, priority) in enumerate(placed):
        if used[card] + gib > 16:
            continue
        used[card] += gib
        pods.append(running_pod(f"p{n}", "n1", {card: gib * 1024}, priority=priority))
    state = cluster({"n1": 3}, pods)
    pod = preemptor(asked * 1024, priority=urgency)
    chosen = select(state, pod)
    lower = [k for k, r in state.pods.items() if r.priority < urgency]
    fitting = [
        set(s) for size in range(len(lower) + 1) for s in itertools.combinations(lower, size)
        if fits_without(state, pod, "n1", list(s))
    ]  # fmt: skip
    if set() in fitting:
        return  # the filter places it without preempting anybody
    if chosen is None:
        assert not fitting
        return
    node, names = chosen
    keys = {f"default/{n}" for n in names}
    assert fits_without(state, pod, node, sorted(keys))
    assert all(state.pods[k].priority < urgency for k in keys)
    total = sum(state.pods[k].priority for k in keys)
    for other in fitting:
        assert not (len(other) < len(keys) and sum(state.pods[k].priority for k in other) < total), other


@pytest.mark.parametrize("mem", [4096, 16384])
def test_without_leaves_the_state_as_it_was(mem: int) -> None:
    state = cluster({"n1": 1}, [running_pod("batch", "n1", {0: mem}, priority=0)])
    before = state.usage_snapshot()
    view = without(state.nodes["n1"], "NVIDIA", [state.pods["default/batch"]])
    assert view.devices[0].usedmem == 0
    assert state.usage_snapshot() == before
