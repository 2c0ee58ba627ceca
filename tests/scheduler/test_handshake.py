"""The node handshake: a node whose daemon stops answering loses its devices, and gets them back on an answer."""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.scheduler.handshake import HandshakeKeeper

KEY = "hami.io/node-handshake"


def test_unanswered_node_is_dropped_until_its_daemon_answers(harness: Harness) -> None:
    node = gpu_node("n1", gpus=1)
    node["metadata"]["annotations"][KEY] = "Reported_2026-11-30 10:00:00"
    harness.add_node(node)
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.add_pod(gpu_pod("p2", mem=1000))
    harness.start()
    assert harness.service is not None
    now = [datetime(2026, 11, 30, 10, 0, 30)]
    keeper = HandshakeKeeper(harness.cluster, harness.host, harness.service.state, clock=lambda: now[0])

    def handshake() -> str:
        return str(meta(harness.cluster.get("nodes", "n1"))["annotations"][KEY])

    assert keeper.round() == {"n1": "Requesting"}
    assert handshake() == "Requesting_2026-11-30 10:00:30"
    harness.flush()
    now[0] += timedelta(seconds=30)
    assert keeper.round() == {}  # still within the timeout
    now[0] += timedelta(seconds=31)
    assert keeper.round() == {"n1": "Deleted"}
    harness.flush()
    answer = harness.filter("p1")
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {"n1": "NVIDIA devices dropped: the node daemon stopped answering the handshake"}
    harness.cluster.patch_metadata("nodes", "n1", annotations={KEY: "Reported_2026-11-30 10:02:00"})
    harness.flush()
    assert harness.filter("p2")["NodeNames"] == ["n1"]


def test_nodes_without_a_handshake_are_left_alone(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1))
    harness.start()
    assert harness.service is not None
    keeper = HandshakeKeeper(harness.cluster, harness.host, harness.service.state)
    assert keeper.round() == {}
    assert KEY not in meta(harness.cluster.get("nodes", "n1"))["annotations"]
