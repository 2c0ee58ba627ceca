"""Gangs (`hami.scheduler.gangs`): all-or-nothing placement through the real service, server and memory cluster."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scheduler_harness import FakeNodeSide, Harness, gpu_node, gpu_pod

from hami.cluster.port import meta
from hami.scheduler.podgroups import (
    GANG_ANNOTATION,
    GANG_SIZE_ANNOTATION,
    GANG_TIMEOUT_ANNOTATION,
    GANG_TOPOLOGY_ANNOTATION,
    KUEUE_COUNT_ANNOTATION,
    KUEUE_GROUP_LABEL,
    POD_GROUP_LABEL,
    VOLCANO_GROUP_ANNOTATION,
    GangError,
    group_of,
)
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import VGPU_NODE_ANNOTATION

AT_BIND = ExtenderSettings(bind_lock_wait_seconds=0.5, record_at_bind=True)
MODES = [pytest.param(AT_BIND, id="record-at-bind"), pytest.param(None, id="record-at-filter")]


def member(name: str, gang: str, size: int, *, mem: int = 16000, **extra: str) -> dict[str, Any]:
    return gpu_pod(name, mem=mem, annotations={GANG_ANNOTATION: gang, GANG_SIZE_ANNOTATION: str(size), **extra})


def start(settings: ExtenderSettings | None, nodes: int = 2, gpus: int = 2) -> Harness:
    h = Harness(settings)
    for i in range(nodes):
        h.add_node(gpu_node(f"node-{i}", gpus=gpus))
    return h


def counted(h: Harness) -> set[str]:
    assert h.service is not None
    with h.service.state.lock:
        return set(h.service.state.pods)


def events(h: Harness, reason: str) -> list[str]:
    return [str(e["message"]) for e in h.cluster.events if e["reason"] == reason]


@pytest.mark.parametrize("settings", MODES)
def test_the_first_member_holds_the_whole_gang_and_none_binds_before_all_have_come(
    settings: ExtenderSettings | None,
) -> None:
    h = start(settings)
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "train", 4))
        h.start()
        first = h.filter("w0")["NodeNames"]
        assert len(first) == 1
        assert counted(h) == {f"default/w{i}" for i in range(4)}  # every member's devices held at once
        h.flush()
        for i in range(4):  # the holds are written where a restarted scheduler finds them
            assert meta(h.cluster.get("pods", f"w{i}"))["annotations"].get(VGPU_NODE_ANNOTATION)
        assert "1 of its 4 held members" in h.bind("w0", first[0])["Error"]
        node_side = FakeNodeSide(h.cluster)
        nodes = [first[0]] + [h.filter(f"w{i}")["NodeNames"][0] for i in range(1, 4)]
        assert sorted(nodes) == ["node-0", "node-0", "node-1", "node-1"]
        for i, node in enumerate(nodes):
            assert h.bind(f"w{i}", node)["Error"] == ""
        h.flush()
        assert all(h.cluster.get("pods", f"w{i}")["spec"].get("nodeName") == nodes[i] for i in range(4))
        node_side.stop()
    finally:
        h.stop()


@pytest.mark.parametrize("settings", MODES)
def test_two_gangs_that_do_not_fit_together_never_both_hold_half(settings: ExtenderSettings | None) -> None:
    h = start(settings)
    try:
        for gang in ("a", "b"):
            for i in range(4):
                h.add_pod(member(f"{gang}{i}", gang, 4))
        h.start()
        assert h.filter("a0")["NodeNames"]
        refused = h.filter("b0")
        assert refused["NodeNames"] == []
        assert "gang b: member b" in next(iter(refused["FailedNodes"].values()))
        assert counted(h) == {f"default/a{i}" for i in range(4)}  # b holds nothing
        assert all(h.filter(f"b{i}")["NodeNames"] == [] for i in range(4))
        assert events(h, "GangDoesNotFit")
    finally:
        h.stop()


def test_a_gang_not_complete_within_its_timeout_holds_nothing_afterwards() -> None:
    h = start(AT_BIND)
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "slow", 4, **{GANG_TIMEOUT_ANNOTATION: "1"}))
        h.add_pod(gpu_pod("other", mem=16000, gpu=2))
        h.start()
        assert h.filter("w0")["NodeNames"]
        assert h.filter("other")["NodeNames"] == []  # everything is held
        deadline = time.monotonic() + 5
        while counted(h) and time.monotonic() < deadline:  # released by its timer, with no filter coming
            time.sleep(0.05)
        assert counted(h) == set()
        h.flush()
        for i in range(4):
            assert VGPU_NODE_ANNOTATION not in (meta(h.cluster.get("pods", f"w{i}")).get("annotations") or {})
        assert len(events(h, "GangReleased")) == 4
        refused = next(iter(h.filter("w1")["FailedNodes"].values()))  # it holds nothing for a while
        assert "did not complete within its timeout 1 time(s) in a row" in refused
        assert counted(h) == set()
        assert h.filter("other")["NodeNames"]  # the devices are free again
    finally:
        h.stop()


def test_a_release_is_told_only_once_every_member_holds_nothing() -> None:
    """A member reading its GangReleased Event finds none of its gang's placements left on the pods."""
    h = start(AT_BIND)
    still_held: list[list[str]] = []
    record = h.cluster.record_event

    def recorded(obj: dict[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
        if reason == "GangReleased":
            pods = [h.cluster.get("pods", f"w{i}") for i in range(4)]
            still_held.append(
                [meta(p)["name"] for p in pods if VGPU_NODE_ANNOTATION in (meta(p).get("annotations") or {})]
            )
        record(obj, reason, message, warning=warning)

    h.cluster.record_event = recorded  # type: ignore[method-assign]
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "slow", 4, **{GANG_TIMEOUT_ANNOTATION: "1"}))
        h.start()
        assert h.filter("w0")["NodeNames"]
        deadline = time.monotonic() + 5
        while len(still_held) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert still_held == [[], [], [], []]
    finally:
        h.stop()


@pytest.mark.parametrize("settings", MODES)
def test_a_restart_while_a_gang_is_half_claimed_loses_nothing_and_double_books_nothing(
    settings: ExtenderSettings | None,
) -> None:
    h = start(settings)
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "train", 4))
        h.add_pod(gpu_pod("intruder", mem=16000))
        h.start()
        nodes = {0: h.filter("w0")["NodeNames"][0], 1: h.filter("w1")["NodeNames"][0]}
        h.flush()
        h.restart()
        assert counted(h) == {f"default/w{i}" for i in range(4)}  # counted from the pods
        assert h.filter("intruder")["NodeNames"] == []  # nothing double-booked
        for i in range(4):
            nodes[i] = h.filter(f"w{i}")["NodeNames"][0]
        assert sorted(nodes.values()) == ["node-0", "node-0", "node-1", "node-1"]
        node_side = FakeNodeSide(h.cluster)
        for i in range(4):
            assert h.bind(f"w{i}", nodes[i])["Error"] == ""
        node_side.stop()
    finally:
        h.stop()


def test_a_podgroup_with_more_members_than_pods_is_waited_on_with_an_event_and_holds_nothing() -> None:
    h = start(AT_BIND)
    try:
        h.cluster.create("podgroups", {"metadata": {"name": "pg", "namespace": "default"}, "spec": {"minMember": 3}})
        for i in range(2):
            pod = gpu_pod(f"w{i}", mem=4000)
            pod["metadata"]["labels"] = {POD_GROUP_LABEL: "pg"}
            h.add_pod(pod)
        h.start()
        answer = h.filter("w0")
        assert answer["NodeNames"] == []
        assert "2 of the 3 members" in next(iter(answer["FailedNodes"].values()))
        assert counted(h) == set()
        assert events(h, "GangWaiting")
        third = gpu_pod("w2", mem=4000)
        third["metadata"]["labels"] = {POD_GROUP_LABEL: "pg"}
        h.add_pod(third)
        h.flush()
        assert h.filter("w0")["NodeNames"]
        assert counted(h) == {"default/w0", "default/w1", "default/w2"}
    finally:
        h.stop()


def test_an_unknown_podgroup_is_waited_on_with_an_event_saying_what_to_fix() -> None:
    h = start(AT_BIND)
    try:
        pod = gpu_pod("w0", mem=4000, annotations={VOLCANO_GROUP_ANNOTATION: "missing"})
        h.add_pod(pod)
        h.start()
        reason = next(iter(h.filter("w0")["FailedNodes"].values()))
        assert "PodGroup default/missing (scheduling.volcano.sh/v1beta1) does not exist" in reason
        assert GANG_SIZE_ANNOTATION in reason
        assert counted(h) == set()
        assert events(h, "GangWaiting")
    finally:
        h.stop()


def test_a_member_moving_to_another_gang_releases_its_gangs_holds() -> None:
    h = start(AT_BIND)
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "train", 4, mem=4000))
        h.start()
        assert h.filter("w0")["NodeNames"]
        assert len(counted(h)) == 4
        h.cluster.patch_metadata("pods", "w3", "default", annotations={GANG_ANNOTATION: "other"})
        h.flush()
        assert counted(h) == set()
        assert h.filter("w0")["NodeNames"] == []  # three members left of four
    finally:
        h.stop()


def test_a_gang_that_asks_for_one_node_is_kept_on_one_node() -> None:
    h = start(AT_BIND, nodes=3, gpus=4)
    try:
        h.add_pod(gpu_pod("filler", mem=16000, gpu=2))
        for i in range(4):
            h.add_pod(member(f"w{i}", "ring", 4, **{GANG_TOPOLOGY_ANNOTATION: "node"}))
        h.start()
        assert h.schedule("filler")
        nodes = {h.filter(f"w{i}")["NodeNames"][0] for i in range(4)}
        assert len(nodes) == 1
    finally:
        h.stop()


def test_an_ordinary_pod_is_placed_as_before_beside_a_held_gang() -> None:
    h = start(AT_BIND, nodes=3)
    try:
        for i in range(4):
            h.add_pod(member(f"w{i}", "train", 4))
        h.add_pod(gpu_pod("solo", mem=16000))
        h.start()
        assert h.filter("w0")["NodeNames"]
        assert h.schedule("solo") == "node-2"
    finally:
        h.stop()


def test_bad_gang_annotations_are_refused_with_what_to_fix() -> None:
    h = start(AT_BIND)
    try:
        h.add_pod(gpu_pod("w0", annotations={GANG_ANNOTATION: "g"}))
        h.start()
        reason = next(iter(h.filter("w0")["FailedNodes"].values()))
        assert f"{GANG_ANNOTATION} needs {GANG_SIZE_ANNOTATION}" in reason
        assert events(h, "InvalidGang")
    finally:
        h.stop()


@pytest.mark.parametrize(
    ("labels", "annotations", "error"),
    [
        ({POD_GROUP_LABEL: "a"}, {VOLCANO_GROUP_ANNOTATION: "b"}, "more than one gang"),
        ({}, {GANG_ANNOTATION: "g", GANG_SIZE_ANNOTATION: "0"}, "whole number from 1"),
        ({}, {GANG_ANNOTATION: "g", GANG_SIZE_ANNOTATION: "x"}, "whole number from 1"),
        ({}, {GANG_ANNOTATION: "G_!", GANG_SIZE_ANNOTATION: "2"}, "not a valid object name"),
        ({}, {GANG_ANNOTATION: "g", GANG_SIZE_ANNOTATION: "2", GANG_TOPOLOGY_ANNOTATION: "rack"}, "'node'"),
    ],
)
def test_group_of_names_what_to_fix(labels: dict[str, str], annotations: dict[str, str], error: str) -> None:
    with pytest.raises(GangError, match=error):
        group_of({"metadata": {"name": "p", "labels": labels, "annotations": annotations}})


def test_group_of_reads_each_convention() -> None:
    ref = group_of({"metadata": {"name": "p", "namespace": "ns", "labels": {POD_GROUP_LABEL: "pg"}}})
    assert ref is not None
    assert (ref.source, ref.namespace, ref.name, ref.size) == ("coscheduling", "ns", "pg", None)
    ref = group_of({"metadata": {"name": "p", "annotations": {VOLCANO_GROUP_ANNOTATION: "vg"}}})
    assert ref is not None
    assert ref.source == "volcano"
    ref = group_of(
        {"metadata": {"name": "p", "labels": {KUEUE_GROUP_LABEL: "kg"}, "annotations": {KUEUE_COUNT_ANNOTATION: "3"}}}
    )
    assert ref is not None
    assert (ref.source, ref.size) == ("kueue", 3)
    with pytest.raises(GangError, match=KUEUE_COUNT_ANNOTATION):
        group_of({"metadata": {"name": "p", "labels": {KUEUE_GROUP_LABEL: "kg"}}})
    assert group_of({"metadata": {"name": "p"}}) is None


_text = st.one_of(st.text(max_size=12), st.sampled_from(["1", "4", "node", "g", "0", "-1", "99999"]))
_keys = st.sampled_from(
    [GANG_ANNOTATION, GANG_SIZE_ANNOTATION, GANG_TIMEOUT_ANNOTATION, GANG_TOPOLOGY_ANNOTATION, VOLCANO_GROUP_ANNOTATION]
)


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    annotations=st.dictionaries(_keys, _text, max_size=5),
    labels=st.dictionaries(st.just(POD_GROUP_LABEL), _text, max_size=1),
)
def test_group_of_answers_a_group_none_or_a_gang_error(annotations: dict[str, str], labels: dict[str, str]) -> None:
    obj = {"metadata": {"name": "p", "labels": labels, "annotations": annotations}}
    try:
        ref = group_of(obj)
    except GangError as exc:
        message = str(exc)
        ref = None
    else:
        message = ""
    assert message or ref is None or (ref.name and ref.timeout >= 1)


def test_a_member_joining_a_waiting_gang_counts_as_a_free_so_its_refused_members_are_retried() -> None:
    h = start(AT_BIND)
    try:
        h.add_pod(member("w0", "late", 2, mem=4000))
        h.start()
        assert h.service is not None
        assert h.filter("w0")["NodeNames"] == []
        frees = h.service.state.frees
        h.add_pod(member("w1", "late", 2, mem=4000))
        h.flush()
        assert h.service.state.frees == frees + 1  # the requeuer nudges w0, refused from the view before
        h.cluster.patch_metadata("pods", "w1", "default", annotations={"unrelated": "x"})
        h.flush()
        assert h.service.state.frees == frees + 1  # an update of a known member frees nothing
        assert h.filter("w0")["NodeNames"]
    finally:
        h.stop()
