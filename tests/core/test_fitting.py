"""The share-fitting building block: accounting, selectors, cordon, exclusivity, device policies, reasons."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.fitting import (
    CORDON_ANNOTATION,
    Candidate,
    ChoiceContext,
    DeviceState,
    ShareFitter,
    hami_device_score,
    node_score,
)
from hami.model import (
    AnnotationKeys,
    Container,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceUsage,
    NodeView,
    Pod,
    ResourceNames,
    RunOrder,
    SchedulingPolicy,
)

KIND = DeviceKind(
    common_word="ACC",
    resources=ResourceNames(count="example.com/acc", memory="example.com/acc-mem", cores="example.com/acc-cores"),
    annotations=AnnotationKeys(
        to_allocate="hami.io/acc-devices-to-allocate",
        allocated="hami.io/acc-devices-allocated",
        use_uuid="example.com/use-uuid",
        nouse_uuid="example.com/nouse-uuid",
        use_type="example.com/use-type",
        nouse_type="example.com/nouse-type",
    ),
)
FITTER = ShareFitter(KIND)


def usage(i: int, *, used: int = 0, mem: int = 0, cores: int = 0, **device: object) -> DeviceUsage:
    fields: dict[str, object] = {"id": f"ACC-{i}", "index": i, "count": 4, "devmem": 16000, "devcore": 100}
    fields.update(device)
    return DeviceUsage(device=Device(**fields), used=used, usedmem=mem, usedcores=cores)  # type: ignore[arg-type]


def pod(*containers: str, **annotations: str) -> Pod:
    return Pod(name="p", annotations=annotations, containers=tuple(Container(name=c) for c in containers or ("main",)))


def req(count: int = 1, memory: int = 0, cores: int = 0, percentage: int | None = None) -> ContainerRequest:
    return ContainerRequest(kind="ACC", count=count, memory=memory, cores=cores, memory_percentage=percentage)


def uuids(node: NodeView, request: ContainerRequest, policy: str = "spread", **annotations: str) -> list[str]:
    (fit,) = FITTER.fit_nodes(pod(**annotations), [request], [node], SchedulingPolicy(device=(policy,)))
    assert fit.placement is not None, fit.reason
    return [d.uuid for d in fit.placement[0]]


def test_binpack_prefers_the_busiest_device_and_spread_the_idlest() -> None:
    node = NodeView(name="n", devices=[usage(0), usage(1, used=1, mem=8000, cores=50), usage(2, used=1, mem=2000)])
    assert uuids(node, req(memory=1000), "binpack") == ["ACC-1"]
    assert uuids(node, req(memory=1000), "spread") == ["ACC-0"]


def test_whole_device_request_needs_an_idle_device() -> None:
    node = NodeView(name="n", devices=[usage(0, used=1, mem=100), usage(1)])
    assert uuids(node, req(percentage=100, cores=100)) == ["ACC-1"]


def test_request_without_cores_avoids_a_device_whose_cores_are_all_taken() -> None:
    node = NodeView(name="n", devices=[usage(0, used=1, cores=100), usage(1, used=2, mem=100, cores=10)])
    assert uuids(node, req(memory=100), "spread") == ["ACC-1"]


def test_selectors_and_cordon_exclude_devices() -> None:
    devices = [usage(0, type="ACC-Big"), usage(1, type="ACC-Small"), usage(2, type="ACC-Small")]
    node = NodeView(name="n", devices=devices, annotations={CORDON_ANNOTATION: "ACC-2"})
    assert uuids(node, req(memory=10), **{"example.com/use-type": "small"}) == ["ACC-1"]
    assert uuids(node, req(memory=10), **{"example.com/nouse-type": "SMALL"}) == ["ACC-0"]
    assert uuids(node, req(memory=10), **{"example.com/use-uuid": "ACC-1,ACC-2"}) == ["ACC-1"]
    # equal scores: HAMi's walk from the end of its sorted list, so the higher index first
    assert uuids(node, req(count=2, memory=10), **{"example.com/nouse-uuid": "ACC-9"}) == ["ACC-1", "ACC-0"]


def test_refusal_counts_why_devices_were_unusable() -> None:
    node = NodeView(name="n", devices=[usage(0, mem=15000), usage(1, mem=15500), usage(2, health=False), usage(3)])
    (fit,) = FITTER.fit_nodes(pod(), [req(count=2, memory=2000)], [node], SchedulingPolicy())
    assert fit.reason == "pod: needs 2 ACC devices, 1/4 usable (2 insufficient memory, 1 unhealthy)"


def test_containers_of_one_pod_see_each_others_grants() -> None:
    node = NodeView(name="n", devices=[usage(0, count=1), usage(1, count=1)])
    (fit,) = FITTER.fit_nodes(pod("a", "b", "c"), [req(), req(), req()], [node], SchedulingPolicy())
    assert fit.reason == "container c: needs 1 ACC device, 0/2 usable (2 no free slot)"
    (fit,) = FITTER.fit_nodes(pod("a", "b"), [req(), None], [node], SchedulingPolicy())
    assert fit.placement is not None
    assert fit.placement[1] == ()


def test_numa_policy_keeps_a_multi_device_request_on_one_numa_node() -> None:
    devices = [usage(0, numa=0), usage(1, numa=1), usage(2, numa=0, used=1), usage(3, numa=1, used=1)]
    node = NodeView(name="n", devices=devices)
    picked = uuids(node, req(count=2, memory=10), "numa")
    assert {d.device.numa for d in devices if d.id in picked} in ({0}, {1})


def test_mutex_policy_uses_only_idle_devices() -> None:
    node = NodeView(name="n", devices=[usage(0, used=1, mem=10), usage(1)])
    assert uuids(node, req(memory=10), "mutex") == ["ACC-1"]


def test_node_score_is_hamis_formula() -> None:
    node = NodeView(name="n", devices=[usage(0, used=2, mem=8000, cores=50), usage(1)])
    assert node_score(node, []) == pytest.approx(10 * (2 / 8 + 50 / 200 + 8000 / 32000))


def test_fitting_does_not_modify_the_node_views() -> None:
    node = NodeView(name="n", devices=[usage(0), usage(1)])
    before = node.model_dump()
    FITTER.fit_nodes(pod(), [req(count=2, memory=100, cores=10)], [node], SchedulingPolicy())
    assert node.model_dump() == before


device_state = st.tuples(
    st.integers(0, 4), st.integers(0, 16000), st.integers(0, 100), st.booleans(), st.integers(0, 1)
).map(lambda t: (min(t[0], 4), t[1], t[2], t[3], t[4]))


@settings(max_examples=200, deadline=None)
@given(
    states=st.lists(device_state, min_size=1, max_size=8),
    requests=st.lists(
        st.builds(req, count=st.integers(1, 3), memory=st.integers(0, 9000), cores=st.integers(0, 100)),
        min_size=1,
        max_size=3,
    ),
    policy=st.sampled_from(["binpack", "spread", "mutex", "numa"]),
)
def test_placements_never_exceed_capacity_and_do_not_depend_on_device_order(
    states: list[tuple[int, int, int, bool, int]], requests: list[ContainerRequest], policy: str
) -> None:
    devices = [usage(i, used=u, mem=m, cores=c, health=h, numa=n) for i, (u, m, c, h, n) in enumerate(states)]
    the_pod = pod(*[f"c{i}" for i in range(len(requests))])
    forward = FITTER.fit_node(
        the_pod, requests, NodeView(name="n", devices=devices), SchedulingPolicy(device=(policy,)), _selectors(the_pod)
    )
    backward = FITTER.fit_node(
        the_pod,
        requests,
        NodeView(name="n", devices=devices[::-1]),
        SchedulingPolicy(device=(policy,)),
        _selectors(the_pod),
    )
    assert forward == backward
    if forward.placement is None:
        assert forward.reason
        return
    taken: dict[str, list[int]] = {d.id: [d.used, d.usedmem, d.usedcores] for d in devices}
    for request, granted in zip(requests, forward.placement, strict=True):
        assert len({g.uuid for g in granted}) == request.count
        for g in granted:
            taken[g.uuid][0] += 1
            taken[g.uuid][1] += g.usedmem
            taken[g.uuid][2] += g.usedcores
    for d in devices:
        used, mem, cores = taken[d.id]
        if (used, mem, cores) != (d.used, d.usedmem, d.usedcores):
            assert used <= d.device.count
            assert mem <= d.device.devmem
            assert cores <= d.device.devcore


def _selectors(p: Pod):  # type: ignore[no-untyped-def]
    from hami.fitting import Selectors

    return Selectors(KIND, p)


# --------------------------------------------------------------------------------------------------------
# The device-choice extension point
# --------------------------------------------------------------------------------------------------------


class HighestIndexFitter(ShareFitter):
    """A vendor's own choice: the usable devices with the highest index, whatever the policy says."""

    def __init__(self) -> None:
        super().__init__(KIND)
        self.seen: list[tuple[list[str], int, list[tuple[str, int]]]] = []

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        self.seen.append(([c.device.id for c in candidates], count, [(s.device.id, s.used) for s in context.devices]))
        return sorted(candidates, key=lambda c: -c.device.index)[:count]


def test_a_subclass_chooses_among_the_usable_devices_and_the_fitter_keeps_the_accounting() -> None:
    fitter = HighestIndexFitter()
    node = NodeView(name="n", devices=[usage(0), usage(1), usage(2, used=4), usage(3)])
    (fit,) = fitter.fit_nodes(pod("a", "b"), [req(1, 1000), req(2, 1000)], [node], SchedulingPolicy())
    assert fit.placement is not None
    assert [[d.uuid for d in devices] for devices in fit.placement] == [["ACC-3"], ["ACC-3", "ACC-1"]]
    first, second = fitter.seen
    assert first == (["ACC-0", "ACC-1", "ACC-3"], 1, [("ACC-0", 0), ("ACC-1", 0), ("ACC-2", 4), ("ACC-3", 0)])
    assert second[2][3] == ("ACC-3", 1)  # the second container sees the first one's grant
    assert fit.score == node_score(node, fit.placement)


def test_a_choice_of_the_wrong_number_of_devices_is_refused_with_the_class_named() -> None:
    class Greedy(ShareFitter):
        def choose_devices(
            self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
        ) -> Sequence[Candidate]:
            return list(candidates)

    node = NodeView(name="n", devices=[usage(0), usage(1)])
    with pytest.raises(ValueError, match=r"Greedy\.choose_devices returned 2 device\(s\) for a request of 1"):
        Greedy(KIND).fit_nodes(pod(), [req(1, 1000)], [node], SchedulingPolicy())


# ---------------------------------------------------------------------------------------------- init containers


def phased(inits: Sequence[str], apps: Sequence[str]) -> Pod:
    return Pod(
        name="p",
        init_containers=tuple(Container(name=c) for c in inits),
        containers=tuple(Container(name=c) for c in apps),
    )


def test_a_device_holds_the_larger_phase_not_the_sum_of_init_and_app_containers() -> None:
    # 10000 MiB for the init container, then 10000 MiB for the app container: one 16000 MiB device serves both,
    # one phase after the other (HAMi places it; summing the phases would need 20000 MiB)
    node = NodeView(name="n", devices=(usage(0),))
    (fit,) = FITTER.fit_nodes(phased(["setup"], ["main"]), [req(1, 10000), req(1, 10000)], [node], SchedulingPolicy())
    assert fit.placement is not None, fit.reason
    assert [[d.uuid for d in c] for c in fit.placement] == [["ACC-0"], ["ACC-0"]]
    # the score counts the pod at its peak: one slot, 10000 MiB
    assert fit.score == pytest.approx(10 * (1 / 4 + 0 + 10000 / 16000))


def test_init_containers_do_not_see_each_other_but_app_containers_add_up() -> None:
    node = NodeView(name="n", devices=(usage(0, used=1, mem=4000),))
    inits = phased(["a", "b", "c"], ["main"])
    (fit,) = FITTER.fit_nodes(inits, [req(1, 12000)] * 3 + [req(1, 12000)], [node], SchedulingPolicy())
    assert fit.placement is not None, fit.reason
    # two app containers of 7000 MiB each do not fit beside the 4000 MiB already used: they run at once
    apps = phased(["setup"], ["one", "two"])
    (fit,) = FITTER.fit_nodes(apps, [req(1, 1000), req(1, 7000), req(1, 7000)], [node], SchedulingPolicy())
    assert fit.reason == "container two: needs 1 ACC device, 0/1 usable (1 insufficient memory)"


def test_an_init_container_larger_than_what_is_free_is_refused_by_name() -> None:
    node = NodeView(name="n", devices=(usage(0, used=1, mem=10000),))
    (fit,) = FITTER.fit_nodes(phased(["setup"], ["main"]), [req(1, 8000), req(1, 1000)], [node], SchedulingPolicy())
    assert fit.reason == "container setup: needs 1 ACC device, 0/1 usable (1 insufficient memory)"


def test_pod_peaks_is_the_larger_phase_per_device() -> None:
    from hami.fitting import pod_peaks
    from hami.model import ContainerDevice

    def on(uuid: str, mem: int, cores: int) -> ContainerDevice:
        return ContainerDevice(uuid=uuid, type="ACC", usedmem=mem, usedcores=cores)

    placement = [(on("A", 9000, 10),), (on("A", 3000, 50), on("B", 100, 0)), (on("A", 2000, 5),), (on("A", 2000, 5),)]
    assert pod_peaks(placement, RunOrder(init=2)) == {"A": (2, 9000, 50), "B": (1, 100, 0)}
    assert pod_peaks(placement, RunOrder()) == {"A": (4, 16000, 70), "B": (1, 100, 0)}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 16000), min_size=0, max_size=3),
    st.lists(st.integers(0, 16000), min_size=1, max_size=3),
    st.integers(0, 16000),
)
def test_the_fitter_places_exactly_what_the_peak_rule_admits(inits: list[int], apps: list[int], busy: int) -> None:
    # one device: the pod fits when every init container fits alone and the app containers fit together
    node = NodeView(name="n", devices=(usage(0, used=1 if busy else 0, mem=busy, count=16),))
    the_pod = phased([f"i{n}" for n in range(len(inits))], [f"a{n}" for n in range(len(apps))])
    requests = [req(1, m) for m in inits + apps]
    (fit,) = FITTER.fit_nodes(the_pod, requests, [node], SchedulingPolicy())
    free = 16000 - busy
    assert fit.fits == (all(m <= free for m in inits) and sum(apps) <= free), fit.reason


# ---------------------------------------------------------------------------------------------- native sidecars


def with_sidecars(inits: Sequence[tuple[str, bool]], apps: Sequence[str]) -> Pod:
    """A pod whose init containers are (name, is a native sidecar)."""
    return Pod(
        name="p",
        init_containers=tuple(Container(name=n, restart_policy="Always" if s else "") for n, s in inits),
        containers=tuple(Container(name=c) for c in apps),
    )


def test_a_sidecar_and_the_app_container_need_room_side_by_side() -> None:
    # 10000 MiB each on 16000 MiB devices: as init + app they share one device, as sidecar + app they cannot
    one = NodeView(name="n", devices=(usage(0),))
    sidecar = with_sidecars([("proxy", True)], ["main"])
    (fit,) = FITTER.fit_nodes(sidecar, [req(1, 10000), req(1, 10000)], [one], SchedulingPolicy())
    assert fit.reason == "container main: needs 1 ACC device, 0/1 usable (1 insufficient memory)"
    two = NodeView(name="n", devices=(usage(0), usage(1)))
    (fit,) = FITTER.fit_nodes(sidecar, [req(1, 10000), req(1, 10000)], [two], SchedulingPolicy())
    assert fit.placement is not None, fit.reason
    assert sorted(c[0].uuid for c in fit.placement) == ["ACC-0", "ACC-1"]
    # the score counts both: two slots, 20000 MiB of 32000
    assert fit.score == pytest.approx(10 * (2 / 8 + 0 + 20000 / 32000))


def test_an_init_container_sees_the_sidecars_started_before_it_not_after() -> None:
    node = NodeView(name="n", devices=(usage(0),))
    # 9000 MiB sidecar, then an init container of 9000: both run at once, 18000 > 16000
    after = with_sidecars([("proxy", True), ("migrate", False)], ["main"])
    (fit,) = FITTER.fit_nodes(after, [req(1, 9000), req(1, 9000), req(1, 1000)], [node], SchedulingPolicy())
    assert fit.reason == "container migrate: needs 1 ACC device, 0/1 usable (1 insufficient memory)"
    # the init container first: it is done before the sidecar starts
    before = with_sidecars([("migrate", False), ("proxy", True)], ["main"])
    (fit,) = FITTER.fit_nodes(before, [req(1, 9000), req(1, 9000), req(1, 1000)], [node], SchedulingPolicy())
    assert fit.placement is not None, fit.reason
    assert fit.score == pytest.approx(10 * (2 / 4 + 0 + 10000 / 16000))  # steady: sidecar + app


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 16000), st.booleans()), min_size=0, max_size=3),
    st.lists(st.integers(0, 16000), min_size=1, max_size=3),
    st.integers(0, 16000),
)
def test_the_fitter_places_a_pod_with_sidecars_exactly_when_its_peak_fits(
    inits: list[tuple[int, bool]], apps: list[int], busy: int
) -> None:
    node = NodeView(name="n", devices=(usage(0, used=1 if busy else 0, mem=busy, count=16),))
    the_pod = with_sidecars([(f"i{n}", s) for n, (_, s) in enumerate(inits)], [f"a{n}" for n in range(len(apps))])
    memory = [m for m, _ in inits] + apps
    (fit,) = FITTER.fit_nodes(the_pod, [req(1, m) for m in memory], [node], SchedulingPolicy())
    (peak,) = the_pod.run_order.peak([(i, (m,)) for i, m in enumerate(memory)])
    assert fit.fits == (peak <= 16000 - busy), fit.reason


def test_containers_after_a_sidecar_see_its_grant_under_spread() -> None:
    # HAMi (PR #2723) fits a sidecar on the device list the app containers use and each later init container on a
    # copy of it: the sidecar takes ACC-1, so the init container and the app container spread to ACC-0
    node = NodeView(name="n", devices=[usage(0), usage(1)])
    the_pod = with_sidecars([("proxy", True), ("migrate", False)], ["a"])
    (fit,) = FITTER.fit_nodes(the_pod, [req(memory=1000)] * 3, [node], SchedulingPolicy(device=("spread",)))
    assert fit.placement is not None
    assert [c[0].uuid for c in fit.placement] == ["ACC-1", "ACC-0", "ACC-0"]


# HAMi v2.10's device order (`policy.DeviceUsageList.Less`, each vendor's `Fit` walking the sorted list backwards)


def test_equal_scores_take_the_highest_numa_node_then_the_highest_index() -> None:
    node = NodeView(name="n", devices=[usage(0, numa=0), usage(1, numa=0), usage(2, numa=1), usage(3, numa=1)])
    assert uuids(node, req(memory=10), "spread") == ["ACC-3"]
    assert uuids(node, req(memory=10), "binpack") == ["ACC-3"]
    assert uuids(node, req(count=3, memory=10), "spread") == ["ACC-3", "ACC-2", "ACC-1"]
    flipped = NodeView(name="n", devices=[usage(0, numa=1), usage(1, numa=1), usage(2, numa=0)])
    assert uuids(flipped, req(memory=10), "spread") == ["ACC-1"]


def test_the_sorted_list_carries_over_from_one_app_container_to_the_next() -> None:
    # HAMi sorts one list in place for all app containers (stably): after three containers have taken one
    # device each, the fourth finds all tied and takes the device its list ends with, not the highest index
    node = NodeView(name="n", devices=[usage(0), usage(1), usage(2)])
    the_pod = pod("a", "b", "c", "d")
    (fit,) = FITTER.fit_nodes(the_pod, [req(memory=1000)] * 4, [node], SchedulingPolicy(device=("spread",)))
    assert fit.placement is not None
    assert [c[0].uuid for c in fit.placement] == ["ACC-2", "ACC-1", "ACC-0", "ACC-0"]


def test_each_init_container_starts_from_the_registration_order() -> None:
    node = NodeView(name="n", devices=[usage(0), usage(1)])
    the_pod = Pod(
        name="p",
        init_containers=(Container(name="i1"), Container(name="i2")),
        containers=(Container(name="a"), Container(name="b")),
    )
    (fit,) = FITTER.fit_nodes(the_pod, [req(memory=1000)] * 4, [node], SchedulingPolicy())
    assert fit.placement is not None
    assert [c[0].uuid for c in fit.placement] == ["ACC-1", "ACC-1", "ACC-1", "ACC-0"]


def test_a_policy_chain_breaks_ties_by_index_and_mutex_puts_busy_devices_first() -> None:
    node = NodeView(name="n", devices=[usage(0, numa=1), usage(1, numa=0), usage(2, numa=0)])
    assert uuids(node, req(memory=10), "numa") == ["ACC-0"]  # highest NUMA node
    (fit,) = FITTER.fit_nodes(pod(), [req(memory=10)], [node], SchedulingPolicy(device=("spread", "mutex")))
    assert fit.placement is not None
    assert fit.placement[0][0].uuid == "ACC-2"
    assert uuids(node, req(memory=10), "spread") == ["ACC-0"]  # a single policy: the NUMA node first
    busy = NodeView(name="n", devices=[usage(0), usage(1, used=1, mem=10), usage(2)])
    assert uuids(busy, req(memory=10), "mutex") == ["ACC-2"]


def test_numa_binding_takes_the_numa_node_hamis_walk_completes_first() -> None:
    devices = [usage(0, numa=0), usage(1, numa=0), usage(2, numa=1), usage(3, numa=1, used=1, mem=4000)]
    node = NodeView(name="n", devices=devices)
    (fit,) = ShareFitter(KIND, numa_bind=True).fit_nodes(pod(), [req(count=2, memory=10)], [node], SchedulingPolicy())
    assert fit.placement is not None
    assert [d.uuid for d in fit.placement[0]] == ["ACC-2", "ACC-3"]


def test_a_numa_request_no_numa_node_can_hold_takes_devices_in_hamis_walk_order() -> None:
    # two devices per NUMA node, three asked: no NUMA node completes, so the devices come in the walk's order
    # (binpack first: the fullest), across NUMA nodes, not grouped by them
    devices = [usage(0, numa=0, used=3), usage(1, numa=0), usage(2, numa=1, used=1), usage(3, numa=1, used=2)]
    node = NodeView(name="n", devices=devices)
    policy = SchedulingPolicy(device=("binpack", "numa"))
    (fit,) = FITTER.fit_nodes(pod(), [req(count=3, memory=10)], [node], policy)
    assert fit.placement is not None
    assert [d.uuid for d in fit.placement[0]] == ["ACC-0", "ACC-3", "ACC-2"]


def test_the_device_score_is_hamis_float32_formula() -> None:
    state = DeviceState(usage(0, used=1, mem=5000, cores=30), 1, 5000, 30)
    assert hami_device_score(state, {"slot": 1, "core": 1, "memory": 1}) == pytest.approx(
        10 * (1 / 4 + 30 / 100 + 5000 / 16000), rel=1e-6
    )
    got = hami_device_score(state, {"slot": 1, "core": 2, "memory": 1}, (1000, 10))
    assert got == struct.unpack("f", struct.pack("f", got))[0]  # a float32 value
    assert got == pytest.approx(10 * (2 / 4 + 2 * 40 / 100 + 6000 / 16000), rel=1e-6)
