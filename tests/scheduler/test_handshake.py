"""The node handshake by HAMi v2.10's rule (`device.CheckHealth`): a node loses a kind's devices only when its
question has expired *and* the node's allocatable for the kind's count resource is 0, and takes them back
when that changes. HAMi's own device plugins never answer, this project's daemons answer `Reported_`: both
keep their nodes while the kubelet offers their devices."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.cluster import meta
from hami.codec import HANDSHAKE_TIME_FORMAT
from hami.scheduler.handshake import HandshakeKeeper
from hami.scheduler.nodes import handshake_verdict

KEY = "hami.io/node-handshake"
GPU = "nvidia.com/gpu"
DROPPED = (
    "NVIDIA devices dropped: the node daemon stopped answering the handshake and the node's kubelet offers none of"
    " them (allocatable 0)"
)


def stamp(when: datetime) -> str:
    return when.strftime(HANDSHAKE_TIME_FORMAT)


def node(name: str, handshake: str | None, allocatable: int) -> dict[str, Any]:
    obj = gpu_node(name, gpus=1)
    if handshake is not None:
        obj["metadata"]["annotations"][KEY] = handshake
    obj["status"]["allocatable"] = {GPU: str(allocatable)}
    return obj


def set_allocatable(h: Harness, name: str, allocatable: int) -> None:
    obj = h.cluster.get("nodes", name)
    obj["status"]["allocatable"] = {GPU: str(allocatable)}
    h.cluster.replace("nodes", obj)
    h.flush()


def handshake_of(h: Harness, name: str) -> str:
    return str(meta(h.cluster.get("nodes", name))["annotations"].get(KEY))


def keeper_at(h: Harness, now: list[datetime]) -> HandshakeKeeper:
    assert h.service is not None
    return HandshakeKeeper(h.cluster, h.plugins, h.service.state, clock=lambda: now[0])


def test_the_rule_is_hamis() -> None:
    now = datetime(2026, 12, 1, 12, 0, 0)
    old = f"Requesting_{stamp(now - timedelta(seconds=61))}"
    assert handshake_verdict(old, 0, now) == "drop"
    assert handshake_verdict(old, 8, now) == "wait"  # expired, but the kubelet still offers the devices
    assert handshake_verdict(f"Requesting_{stamp(now - timedelta(seconds=59))}", 0, now) == "wait"
    assert handshake_verdict("Requesting_yesterday", 0, now) == "wait"  # unreadable: left alone, as HAMi
    assert handshake_verdict("Requesting", 0, now) == "wait"
    for value in (f"Reported_{stamp(now)}", "anything", None):
        assert handshake_verdict(value, 0, now) == "ask"
    # HAMi asks again after a Deleted_ (it looks only for Requesting) and serves the node's devices meanwhile;
    # on a node whose kubelet offers none the devices stay dropped and nothing is written
    assert handshake_verdict(f"Deleted_{stamp(now - timedelta(hours=1))}", 8, now) == "ask"
    assert handshake_verdict(f"Deleted_{stamp(now - timedelta(hours=1))}", 0, now) == "dropped"


def test_a_node_running_hamis_device_plugin_keeps_its_devices_though_it_never_answers(harness: Harness) -> None:
    """(a) this scheduler replacing HAMi's: HAMi v2.10's plugins never write Reported_, the kubelet offers GPUs."""
    harness.add_node(node("n1", None, allocatable=10))
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.start()
    now = [datetime.now().replace(microsecond=0)]
    keeper = keeper_at(harness, now)
    assert keeper.round() == {"n1": "Requesting"}  # a node that registers devices is asked, as HAMi asks
    harness.flush()
    now[0] += timedelta(minutes=10)  # never answered
    assert keeper.round() == {}
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == ["n1"]
    assert handshake_of(harness, "n1").startswith("Requesting_")


def test_a_node_whose_daemon_is_gone_is_dropped_and_taken_back_when_the_kubelet_offers_devices(
    harness: Harness,
) -> None:
    harness.add_node(node("n1", None, allocatable=10))
    for name in ("p1", "p2"):
        harness.add_pod(gpu_pod(name, mem=1000))
    harness.start()
    now = [datetime.now().replace(microsecond=0)]
    keeper = keeper_at(harness, now)
    keeper.round()
    harness.flush()
    set_allocatable(harness, "n1", 0)  # the device plugin is gone: the kubelet offers no GPU any more
    now[0] += timedelta(seconds=61)
    assert keeper.round() == {"n1": "Deleted"}
    harness.flush()
    answer = harness.filter("p1")
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {"n1": DROPPED}
    now[0] += timedelta(minutes=10)
    assert keeper.round() == {}  # stays dropped while the kubelet offers none: nothing written
    harness.flush()
    assert harness.filter("p1")["FailedNodes"] == {"n1": DROPPED}
    set_allocatable(harness, "n1", 10)  # the plugin is back: the Deleted_ drops nothing any more
    assert harness.filter("p1")["NodeNames"] == ["n1"]
    assert keeper.round() == {"n1": "Requesting"}  # HAMi asks again after a Deleted_ and counts the node
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == ["n1"]


def test_a_deleted_handshake_on_a_node_the_kubelet_offers_devices_on_is_asked_again_and_served(
    harness: Harness,
) -> None:
    """HAMi v2.10's `CheckHealth` looks only for `Requesting`: a `Deleted_` (left by HAMi's scheduler, or by this
    one before the kubelet offered the devices again) gets a new question, and the node keeps serving."""
    now = [datetime.now().replace(microsecond=0)]
    harness.add_node(node("n1", f"Deleted_{stamp(now[0] - timedelta(hours=3))}", allocatable=10))
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.start()
    assert harness.filter("p1")["NodeNames"] == ["n1"]  # served before any round
    keeper = keeper_at(harness, now)
    assert keeper.round() == {"n1": "Requesting"}
    assert handshake_of(harness, "n1") == f"Requesting_{stamp(now[0])}"
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == ["n1"]
    now[0] += timedelta(minutes=5)  # unanswered (HAMi's own plugin), the kubelet still offers: kept
    assert keeper.round() == {}
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == ["n1"]


def test_this_projects_daemon_answer_is_asked_again(harness: Harness) -> None:
    """(b)'s other half: a Reported_ answer is followed by a new question, so the question never expires."""
    now = [datetime.now().replace(microsecond=0)]
    harness.add_node(node("n1", f"Reported_{stamp(now[0])}", allocatable=0))
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.start()
    keeper = keeper_at(harness, now)
    assert keeper.round() == {"n1": "Requesting"}
    assert handshake_of(harness, "n1") == f"Requesting_{stamp(now[0])}"
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == ["n1"]


def test_a_restarted_scheduler_does_not_place_on_a_node_whose_daemon_is_long_gone(harness: Harness) -> None:
    """Before any handshake round: an expired question on a node that offers no GPU drops it at once; the
    same question on a node whose kubelet still offers GPUs does not."""
    long_ago = f"Requesting_{stamp(datetime.now() - timedelta(hours=2))}"
    harness.add_node(node("gone", long_ago, allocatable=0))
    harness.add_node(node("offered", long_ago, allocatable=10))
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.start()
    answer = harness.filter("p1")
    assert answer["NodeNames"] == ["offered"]
    assert answer["FailedNodes"] == {"gone": DROPPED}


def test_an_answered_node_the_kubelet_offers_devices_on_is_not_asked_again_until_the_offer_ends(
    harness: Harness,
) -> None:
    """Only patches that change something: while the kubelet offers the devices no answer can drop them, so an
    answered node is left alone; once the offer ends it is asked, and dropped if the question stays unanswered."""
    now = [datetime.now().replace(microsecond=0)]
    harness.add_node(node("n1", f"Reported_{stamp(now[0])}", allocatable=10))
    harness.add_pod(gpu_pod("p1", mem=1000))
    harness.start()
    keeper = keeper_at(harness, now)
    assert keeper.round() == {}
    assert handshake_of(harness, "n1") == f"Reported_{stamp(now[0])}"
    set_allocatable(harness, "n1", 0)
    now[0] += timedelta(seconds=30)
    assert keeper.round() == {"n1": "Requesting"}
    harness.flush()
    now[0] += timedelta(seconds=61)
    assert keeper.round() == {"n1": "Deleted"}
    harness.flush()
    assert harness.filter("p1")["NodeNames"] == []


def test_nodes_without_the_kind_are_left_alone(harness: Harness) -> None:
    harness.add_node({"metadata": {"name": "cpu", "annotations": {}}, "status": {}})
    harness.start()
    assert harness.service is not None
    keeper = HandshakeKeeper(harness.cluster, harness.plugins, harness.service.state)
    assert keeper.round() == {}
    assert KEY not in (meta(harness.cluster.get("nodes", "cpu")).get("annotations") or {})
