"""Each member's devices within one island of linked devices (`hami.islands`), through the real filter.

The islands come from what the vendors' discovery publishes (NVIDIA's NVLink scores, Ascend's HCCS NetworkID,
MetaX's MetaXLink zone); the rule that keeps a pod within one is the core's, applied by the vendor facade the
filter calls (`VendorPlugins.fit_nodes`).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.codec import encode_link_scores
from hami.islands import GANG_TOPOLOGY_ANNOTATION, islands_from_links, topology_words
from hami.model import (
    Container,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami.scheduler.podgroups import GANG_ANNOTATION, GANG_SIZE_ANNOTATION
from hami.scheduler.settings import ExtenderSettings

AT_BIND = ExtenderSettings(bind_lock_wait_seconds=0.5, record_at_bind=True)
NVLINK, PCIE = 160, 20
"""HAMi's scores: one NVLink and a shared board (100 + 60), and two GPUs across a host bridge."""


def linked_node(name: str, pairs: list[tuple[int, int]], gpus: int = 4) -> dict[str, Any]:
    """A 4-GPU node whose NVLinks join the GPUs of each pair, as NVIDIA's discovery publishes them."""
    node = gpu_node(name, gpus=gpus)
    ids = [f"GPU-{name}-{i}" for i in range(gpus)]
    scores = {a: {b: PCIE for b in ids if b != a} for a in ids}
    for i, j in pairs:
        scores[ids[i]][ids[j]] = scores[ids[j]][ids[i]] = NVLINK
    node["metadata"]["annotations"]["hami.io/node-nvidia-score"] = encode_link_scores(scores)
    return node


def member(name: str, gang: str, size: int, topology: str | None = "island", gpu: int = 2) -> dict[str, Any]:
    annotations = {GANG_ANNOTATION: gang, GANG_SIZE_ANNOTATION: str(size)}
    if topology is not None:
        annotations[GANG_TOPOLOGY_ANNOTATION] = topology
    return gpu_pod(name, gpu=gpu, mem=16000, annotations=annotations)


def gpus_of(h: Harness, name: str) -> set[int]:
    """The indexes of the GPUs the scheduler counts for the pod."""
    assert h.service is not None
    with h.service.state.lock:
        record = h.service.state.pods[f"default/{name}"]
        return {int(d.uuid.rsplit("-", 1)[1]) for cp in record.allocation["NVIDIA"] for d in cp}


@pytest.mark.parametrize("settings", [AT_BIND, None], ids=["record-at-bind", "record-at-filter"])
def test_each_member_of_an_island_gang_gets_gpus_joined_by_nvlink(settings: ExtenderSettings | None) -> None:
    h = Harness(settings)
    h.add_node(linked_node("node-0", [(0, 2), (1, 3)]))  # NVLink islands {0, 2} and {1, 3}
    try:
        for i in range(2):
            h.add_pod(member(f"w{i}", "ring", 2))
        h.start()
        assert h.filter("w0")["NodeNames"] == ["node-0"]
        assert h.filter("w1")["NodeNames"] == ["node-0"]
        assert sorted([gpus_of(h, "w0"), gpus_of(h, "w1")], key=min) == [{0, 2}, {1, 3}]
    finally:
        h.stop()


def test_without_the_annotation_the_same_gang_crosses_islands() -> None:
    """The control: the device policy alone takes GPUs 0 and 1, which no NVLink joins."""
    h = Harness(AT_BIND)
    h.add_node(linked_node("node-0", [(0, 2), (1, 3)]))
    try:
        for i in range(2):
            h.add_pod(member(f"w{i}", "ring", 2, topology=None))
        h.start()
        assert h.filter("w0")["NodeNames"] == ["node-0"]
        assert {frozenset(gpus_of(h, f"w{i}")) for i in range(2)} != {frozenset({0, 2}), frozenset({1, 3})}
    finally:
        h.stop()


def test_an_island_gang_that_no_island_holds_is_refused_saying_so_and_holds_nothing() -> None:
    h = Harness(AT_BIND)
    h.add_node(gpu_node("node-0", gpus=4))  # no NVLink published: every GPU an island of its own
    h.add_node(linked_node("node-1", [(0, 1)]))  # one island of two: one member's worth
    try:
        for i in range(2):
            h.add_pod(member(f"w{i}", "pair", 2))
        h.start()
        answer = h.filter("w0")
        assert answer["NodeNames"] == []
        assert "no island of linked devices holds the pod" in answer["FailedNodes"]["node-0"]
        assert h.service is not None
        with h.service.state.lock:
            assert set(h.service.state.pods) == set()
    finally:
        h.stop()


def test_node_and_island_together_keep_the_gang_on_one_node_within_islands() -> None:
    h = Harness(AT_BIND)
    h.add_node(linked_node("node-0", [(0, 1)]))  # one pair: one member only
    h.add_node(linked_node("node-1", [(0, 3), (1, 2)]))  # two pairs: the whole gang
    try:
        for i in range(2):
            h.add_pod(member(f"w{i}", "ring", 2, topology="node,island"))
        h.start()
        assert h.filter("w0")["NodeNames"] == ["node-1"]
        assert h.filter("w1")["NodeNames"] == ["node-1"]
        assert sorted([gpus_of(h, "w0"), gpus_of(h, "w1")], key=min) == [{0, 3}, {1, 2}]
    finally:
        h.stop()


def test_an_island_gang_takes_the_tightest_island_so_whole_islands_stay_whole() -> None:
    """A one-GPU member goes to the island already in use, not into the idle pair."""
    h = Harness(AT_BIND)
    h.add_node(linked_node("node-0", [(0, 1), (2, 3)]))
    try:
        h.add_pod(gpu_pod("busy", gpu=1, mem=16000, annotations={"nvidia.com/use-gpuuuid": "GPU-node-0-2"}))
        h.add_pod(member("w0", "one", 1, gpu=1))
        h.start()
        assert h.schedule("busy") == "node-0"
        assert h.filter("w0")["NodeNames"] == ["node-0"]
        assert gpus_of(h, "busy") == {2}
        assert gpus_of(h, "w0") == {3}  # the idle island {0, 1} stays whole
    finally:
        h.stop()


def test_a_bad_topology_word_is_refused_with_the_words_understood() -> None:
    h = Harness(AT_BIND)
    h.add_node(linked_node("node-0", [(0, 1)]))
    try:
        h.add_pod(member("w0", "g", 1, topology="island,rack", gpu=1))
        h.start()
        reason = next(iter(h.filter("w0")["FailedNodes"].values()))
        assert "'node,island'" in reason
        assert "'island,rack'" in reason
    finally:
        h.stop()


# ---------------------------------------------------------------------------------- the rule's building blocks


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=12))
def test_islands_from_links_are_the_connected_groups_of_linked_pairs(edges: list[tuple[int, int]]) -> None:
    ids = [f"d{i}" for i in range(8)]
    scores: dict[str, dict[str, int]] = {a: {} for a in ids}
    for i, j in edges:
        if i != j:
            scores[ids[i]][ids[j]] = scores[ids[j]][ids[i]] = 100
    islands = islands_from_links(ids, scores, 100)
    reach = {i: {i} for i in range(8)}  # the transitive closure, computed the slow way
    for _ in range(8):
        for i, j in edges:
            reach[i] |= reach[j]
            reach[j] |= reach[i]
    for i in range(8):
        assert (ids[i] in islands) == (len(reach[i]) > 1)  # a device linked to none is an island of its own
        for j in range(8):
            if i != j:
                assert (ids[i] in islands and islands.get(ids[i]) == islands.get(ids[j])) == (j in reach[i])


def test_a_link_seen_from_one_end_only_joins_nothing() -> None:
    assert islands_from_links(["a", "b"], {"a": {"b": 160}, "b": {"a": 0}}, 100) == {}


@given(st.text(max_size=30))
def test_any_topology_value_is_read_or_refused_with_a_clear_error(value: str) -> None:
    known = {w.strip() for w in value.split(",") if w.strip()} <= {"node", "island"}
    if known:
        assert topology_words(value) <= {"node", "island"}
    else:
        with pytest.raises(ValueError, match="'node,island'"):
            topology_words(value)


# ---------------------------------------------------------------------------------- each vendor's islands


def island_pod(topology: str | None = "island") -> Pod:
    annotations = {GANG_TOPOLOGY_ANNOTATION: topology} if topology else {}
    return Pod(name="p", namespace="ml", annotations=annotations, containers=(Container(name="c"),))


def placed(plugins: VendorPlugins, kind: str, view: NodeView, request: ContainerRequest, pod: Pod) -> list[str] | str:
    (fit,) = plugins.fit_nodes(kind, pod, [request], [view], SchedulingPolicy(node="binpack", device=("binpack",)))
    return sorted(d.uuid for d in fit.placement[0]) if fit.placement else fit.reason


def test_ascend_910_members_stay_within_one_hccs_network() -> None:
    plugins = VendorPlugins.load(disabled=())
    word = "Ascend910B3"
    devices = [
        DeviceUsage(
            device=Device(id=f"npu{i}", index=i, count=4, devmem=65536, devcore=20, type=word,
                          custom={"NetworkID": i % 2}),
            used=1 if i in (0, 1) else 0, usedmem=65536 if i in (0, 1) else 0,
        )
        for i in range(8)
    ]  # fmt: skip
    view = NodeView(name="n", devices=devices)
    request = ContainerRequest(kind=word, count=3, memory=65536, cores=20)
    assert placed(plugins, word, view, request, island_pod()) in (["npu2", "npu4", "npu6"], ["npu3", "npu5", "npu7"])
    four = ContainerRequest(kind=word, count=4, memory=65536, cores=20)
    assert "no island of linked devices holds the pod" in str(placed(plugins, word, view, four, island_pod()))
    assert isinstance(placed(plugins, word, view, four, island_pod(None)), list)  # without it, across networks


def test_metax_members_stay_within_one_metaxlink_zone() -> None:
    plugins = VendorPlugins.load(disabled=())
    word = "Metax-GPU"
    zones = [1, 2, 1, 2, 0, 0]
    devices = [
        DeviceUsage(
            device=Device(id=f"GPU-{i}", index=i, count=1, devmem=65536, devcore=100, type=word,
                          custom={"QosPolicy": "", "Model": "MXC500", "LinkZone": z}),
            used=1 if i == 0 else 0, usedmem=65536 if i == 0 else 0, usedcores=100 if i == 0 else 0,
        )
        for i, z in enumerate(zones)
    ]  # fmt: skip
    view = NodeView(name="n", devices=devices)
    two = ContainerRequest(kind=word, count=2, memory=65536, cores=100)
    assert placed(plugins, word, view, two, island_pod()) == ["GPU-1", "GPU-3"]  # zone 2: zone 1 has one card free
    three = ContainerRequest(kind=word, count=3, memory=65536, cores=100)
    assert "no island of linked devices holds the pod" in str(placed(plugins, word, view, three, island_pod()))
