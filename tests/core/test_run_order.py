"""The run-order rule (`hami.model.RunOrder`): what a pod with init containers and native sidecars holds at its
peak, the one rule the fitter, the bookkeeping, quota and kube-scheduler's CPU and memory count all follow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hami.fitting import pod_peaks
from hami.model import NO_INIT, Container, ContainerDevice, Pod, RunOrder, cpu_memory_requests

# ------------------------------------------------------------------------------------------------- the rule


def test_a_sidecar_adds_to_the_app_containers_where_an_init_container_does_not() -> None:
    # 10 for the first container, 10 for the app container
    assert RunOrder(init=1).peak([(0, (10,)), (1, (10,))]) == (10,)  # one after the other
    assert RunOrder(init=1, sidecars=frozenset({0})).peak([(0, (10,)), (1, (10,))]) == (20,)  # side by side


def test_an_init_container_runs_beside_the_sidecars_declared_before_it_only() -> None:
    # positions: 0 init (8), 1 sidecar (3), 2 init (6), 3 sidecar (2), 4 app (1)
    amounts = [(0, (8,)), (1, (3,)), (2, (6,)), (3, (2,)), (4, (1,))]
    order = RunOrder(init=4, sidecars=frozenset({1, 3}))
    # init phase: 8 alone, then 3 + 6 = 9 (the sidecar at 3 starts after it); steady: 3 + 2 + 1 = 6
    assert order.peak(amounts) == (9,)
    # the same containers as plain init containers: the largest of them, or the app container
    assert RunOrder(init=4).peak(amounts) == (8,)


def test_each_component_takes_its_own_peak() -> None:
    # (MiB, cores): the init container peaks in memory, the steady state in cores
    order = RunOrder(init=2, sidecars=frozenset({1}))
    assert order.peak([(0, (9000, 10)), (1, (1000, 40)), (2, (2000, 40))]) == (9000, 80)


def test_nothing_given_is_nothing_held() -> None:
    assert RunOrder(init=2, sidecars=frozenset({0})).peak([]) == ()


def test_roles_by_position() -> None:
    order = RunOrder(init=2, sidecars=frozenset({1}))
    assert [order.role(i) for i in range(4)] == ["init", "sidecar", "app", "app"]
    assert [order.steady(i) for i in range(4)] == [False, True, True, True]


# ------------------------------------------------------------------------------------------------- properties

roles = st.lists(st.tuples(st.sampled_from(["init", "sidecar", "app"]), st.integers(0, 20000)), max_size=8)


def order_of(pod: Sequence[tuple[str, int]]) -> tuple[RunOrder, list[tuple[int, tuple[int]]]]:
    """The pod's run order and amounts, its init containers and sidecars first in the order given."""
    inits = [(r, a) for r, a in pod if r != "app"]
    apps = [(r, a) for r, a in pod if r == "app"]
    order = RunOrder(len(inits), frozenset(i for i, (r, _) in enumerate(inits) if r == "sidecar"))
    return order, [(i, (a,)) for i, (_, a) in enumerate(inits + apps)]


def simulated(pod: Sequence[tuple[str, int]]) -> int:
    """What the kubelet runs at once, moment by moment: each init container in turn beside the sidecars already
    started, each sidecar once started, then the app containers beside every sidecar."""
    inits = [(r, a) for r, a in pod if r != "app"]
    running: list[int] = []  # the sidecars started so far
    most = 0
    for role, amount in inits:
        if role == "sidecar":
            running.append(amount)
            most = max(most, sum(running))
        else:
            most = max(most, sum(running) + amount)
    return max(most, sum(running) + sum(a for r, a in pod if r == "app"))


@settings(max_examples=300, deadline=None)
@given(roles)
def test_the_peak_is_what_runs_at_once_at_the_busiest_moment(pod: list[tuple[str, int]]) -> None:
    order, amounts = order_of(pod)
    assert order.peak(amounts) == ((simulated(pod),) if pod else ())


@settings(max_examples=300, deadline=None)
@given(roles, st.integers(0, 20000), st.data())
def test_a_sidecar_never_counts_less_than_the_same_container_as_an_app_container(
    pod: list[tuple[str, int]], amount: int, data: st.DataObject
) -> None:
    order, amounts = order_of([*pod, ("app", amount)])
    as_app = order.peak(amounts)
    inits = [c for c in pod if c[0] != "app"]
    at = data.draw(st.integers(0, len(inits)), label="sidecar position among the init containers")
    apps = [c for c in pod if c[0] == "app"]
    order, amounts = order_of([*inits[:at], ("sidecar", amount), *inits[at:], *apps])
    assert order.peak(amounts) >= as_app


@settings(max_examples=300, deadline=None)
@given(roles, st.data())
def test_a_sidecar_never_counts_less_than_the_same_container_as_an_init_container(
    pod: list[tuple[str, int]], data: st.DataObject
) -> None:
    inits = [i for i, (r, _) in enumerate(pod) if r == "init"]
    if not inits:
        return
    at = data.draw(st.sampled_from(inits))
    order, amounts = order_of(pod)
    changed = [("sidecar", a) if i == at else (r, a) for i, (r, a) in enumerate(pod)]
    sidecar_order, same_amounts = order_of(changed)
    assert same_amounts == amounts
    assert sidecar_order.peak(amounts) >= order.peak(amounts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 20000), max_size=4), st.lists(st.integers(0, 20000), min_size=1, max_size=4))
def test_without_sidecars_the_pod_holds_its_largest_init_container_or_its_app_containers(
    inits: list[int], apps: list[int]
) -> None:
    amounts = [(i, (a,)) for i, a in enumerate(inits + apps)]
    assert RunOrder(init=len(inits)).peak(amounts) == (max([*inits, sum(apps)]),)


@settings(max_examples=200, deadline=None)
@given(roles, st.data())
def test_containers_holding_nothing_may_be_left_out(pod: list[tuple[str, int]], data: st.DataObject) -> None:
    order, amounts = order_of(pod)
    kept = [(i, a) for i, a in amounts if a != (0,) or data.draw(st.booleans())]
    if kept:
        assert order.peak(kept) == order.peak(amounts)


# ------------------------------------------------------------------------------------------------- reading pods


def spec(*inits: dict[str, Any], apps: int = 1) -> dict[str, Any]:
    return {"initContainers": list(inits), "containers": [{"name": f"app{i}"} for i in range(apps)]}


def test_a_pod_knows_its_sidecars_from_the_init_containers_restart_policy() -> None:
    the_spec = spec(
        {"name": "fetch"},
        {"name": "proxy", "restartPolicy": "Always"},
        {"name": "migrate", "restartPolicy": "Never"},  # not a value Kubernetes allows: not a sidecar
    )
    pod = Pod.from_api({"metadata": {"name": "p"}, "spec": the_spec})
    assert [c.restart_policy for c in pod.init_containers] == ["", "Always", "Never"]
    assert pod.run_order == RunOrder(init=3, sidecars=frozenset({1}))
    assert RunOrder.of_spec(the_spec) == pod.run_order


def test_a_pod_without_init_containers_runs_every_container_at_once() -> None:
    assert Pod(name="p", containers=(Container(name="a"),)).run_order == NO_INIT
    assert RunOrder.of_spec({"containers": [{"name": "a"}]}) == NO_INIT
    assert RunOrder.of_spec({"initContainers": None}) == NO_INIT
    assert RunOrder.of_spec({"initContainers": "not a list"}) == NO_INIT
    assert RunOrder.of_spec({"initContainers": [None, {"restartPolicy": "Always"}]}) == RunOrder(2, frozenset({1}))


def test_kube_scheduler_counts_a_sidecars_cpu_and_memory_with_the_app_containers() -> None:
    def container(name: str, cpu: str, memory: str, **extra: str) -> dict[str, Any]:
        return {"name": name, "resources": {"requests": {"cpu": cpu, "memory": memory}}, **extra}

    # Kubernetes' effective request: max(init 2 CPU beside the 500m sidecar, 500m sidecar + 1 CPU app)
    the_spec = {
        "initContainers": [
            container("proxy", "500m", "256Mi", restartPolicy="Always"),
            container("migrate", "2", "1Gi"),
        ],
        "containers": [container("app", "1", "2Gi")],
    }
    assert cpu_memory_requests(the_spec) == (2500, 2304)
    del the_spec["initContainers"][0]["restartPolicy"]  # a plain init container: done before the others start
    assert cpu_memory_requests(the_spec) == (2000, 2048)


def test_pod_peaks_counts_a_sidecar_on_a_device_as_one_more_container() -> None:
    def on(uuid: str, mem: int, cores: int) -> tuple[ContainerDevice, ...]:
        return (ContainerDevice(uuid=uuid, type="ACC", usedmem=mem, usedcores=cores),)

    placement = [on("A", 4000, 20), on("A", 9000, 10), on("A", 3000, 30), on("B", 1000, 0)]
    # position 0 a sidecar, 1 an init container, 2 and 3 app containers
    order = RunOrder(init=2, sidecars=frozenset({0}))
    # A: init phase 4000 + 9000 (two containers at once), steady 4000 + 3000; cores 20 + 10 or 20 + 30
    assert pod_peaks(placement, order) == {"A": (2, 13000, 50), "B": (1, 1000, 0)}
    assert pod_peaks(placement, RunOrder(init=2)) == {"A": (1, 9000, 30), "B": (1, 1000, 0)}
