"""The candidate index (`hami.scheduler.ranking`) changes no decision: the same operations on two schedulers,
one keeping its rankings current from the change log and one rebuilding them at every filter, give the same
answers, reasons included."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.plugins import VendorPlugins
from hami.scheduler.changes import ChangeLog
from hami.scheduler.extender import ExtenderSettings
from hami.scheduler.ranking import Rankings
from hami.scheduler.state import ClusterState

NODES = [("a100-0", "NVIDIA-A100"), ("a100-1", "NVIDIA-A100"), ("h100-0", "NVIDIA-H100"), ("h100-1", "NVIDIA-H100")]

pods = st.tuples(
    st.just("pod"),
    st.integers(1, 2),
    st.sampled_from([1000, 4000, 9000, 16000]),
    st.sampled_from([0, 30, 100]),
    st.sampled_from(["", "spread", "binpack"]),
    st.sampled_from(["", "H100", "A100"]),
    st.none() | st.lists(st.sampled_from([n for n, _ in NODES] + ["ghost"]), unique=True),  # kube-scheduler's cut
)
deletions = st.tuples(st.just("delete"), st.integers(0, 40))
node_changes = st.tuples(st.just("node"), st.integers(0, len(NODES) - 1), st.integers(1, 4))


def _apply(h: Harness, op: tuple[Any, ...], i: int) -> dict[str, Any] | None:
    if op[0] == "pod":
        _, gpu, mem, cores, policy, model, names = op
        annotations = {}
        if policy:
            annotations["hami.io/node-scheduler-policy"] = policy
        if model:
            annotations["nvidia.com/use-gputype"] = model
        h.add_pod(gpu_pod(f"p{i}", gpu=gpu, mem=mem, cores=cores or None, annotations=annotations))
        h.flush()
        answer = h.filter(f"p{i}", nodes=names)
        h.flush()
        return answer
    if op[0] == "delete":
        placed = sorted(meta(p)["name"] for p in h.cluster.list("pods")[0])
        if placed:
            h.cluster.delete("pods", placed[op[1] % len(placed)], "default")
    else:
        name, model = NODES[op[1]]
        register = gpu_node(name, gpus=op[2], model=model)["metadata"]["annotations"]
        h.cluster.patch_metadata("nodes", name, annotations=register)
    h.flush()
    return None


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.one_of(pods, pods, pods, deletions, node_changes), min_size=5, max_size=16),
    policy=st.sampled_from(["binpack", "spread", "fragmentation-aware", "best-fit"]),
)
def test_a_kept_ranking_decides_as_one_built_afresh(ops: list[tuple[Any, ...]], policy: str) -> None:
    kept, fresh = (Harness(ExtenderSettings(node_policy=policy, bind_lock_wait_seconds=0.5)) for _ in range(2))
    try:
        for h in (kept, fresh):
            for name, model in NODES:
                h.add_node(gpu_node(name, gpus=2, model=model))
            h.start()
        assert kept.service is not None
        assert fresh.service is not None
        fresh.service.extender.candidates.rankings = Rankings(fresh.service.state, kept=0)  # rebuilt at every filter
        for i, op in enumerate(ops):
            assert _apply(kept, op, i) == _apply(fresh, op, i), (i, op)
    finally:
        kept.stop()
        fresh.stop()


def test_a_filter_of_a_known_shape_evaluates_only_the_nodes_changed_since() -> None:
    h = Harness()
    try:
        for i in range(20):
            h.add_node(gpu_node(f"n{i:02d}", gpus=2))
        h.start()
        assert h.service is not None
        evaluated: list[str] = []
        rankings = h.service.extender.candidates.rankings
        current = rankings.current

        def counting(shape: int, evaluate: Any, classes: Any = None) -> Any:
            def counted(name: str) -> Any:
                evaluated.append(name)
                return evaluate(name)

            return current(shape, counted, classes)

        rankings.current = counting  # type: ignore[method-assign]
        for i in range(3):
            h.add_pod(gpu_pod(f"p{i}", mem=1000))
            h.flush()
            node = h.filter(f"p{i}")["NodeNames"][0]
            h.flush()
            if i == 0:
                assert len(evaluated) == 1  # built once for the shape, one node per class: the 20 nodes are alike
            else:
                assert set(evaluated) == {node}, "only the node the last decision changed is evaluated again"
            evaluated.clear()
        assert rankings.rebuilds == 1
    finally:
        h.stop()


def test_a_ranking_kept_across_a_rebuilt_state_is_rebuilt_with_it() -> None:
    # `ClusterState.replay` restarts the change log: a ranking current to any position handed out before must be
    # rebuilt from the new nodes, never brought up to date from the entries appended since (they start again)
    state = ClusterState(VendorPlugins.load(disabled=()))
    for i in range(6):
        state.set_node(gpu_node(f"old{i}", gpus=2))
    rankings = Rankings(state)
    built = rankings.current(1, lambda name: (None, 0.0, 0))
    assert set(built.ranked) == {f"old{i}" for i in range(6)}
    before = state.changes.position
    state.replay([gpu_node("new0", gpus=2), gpu_node("new1", gpus=2)], [])
    assert state.changes.position > before, "positions only grow, across restarts"
    assert state.changes.since(before) is None, "a reader current to before the restart rebuilds"
    after = rankings.current(1, lambda name: (None, 0.0, 0))
    assert set(after.ranked) == {"new0", "new1"}
    assert rankings.rebuilds == 2


def test_every_position_from_before_a_restart_reads_as_dropped() -> None:
    log = ChangeLog()
    for name in ["a", "b", "c", "a"]:
        log.append(name)
    handed = list(range(log.position + 1))
    log.restart()
    assert all(log.since(p) is None for p in handed)
    log.append("d")
    assert log.since(log.position - 1) == {"d"}
    assert log.position > handed[-1]
