"""Fitting and scoring MetaX pods as HAMi v2.10 does: whole cards over MetaXLink and MetaX's topology tables,
shared cards with QoS policies, app classes, exclusive placement within a MetaXLink group and the policy-neutral
score; and the pod annotations a placement writes."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from hami.codec import encode_link_scores
from hami.model import (
    Container,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    NodeFit,
    NodeView,
    PlacedPod,
    Pod,
    SchedulingPolicy,
)
from hami.plugins import VendorPlugins
from hami_vendor_metax import plugin
from hami_vendor_metax.discovery import GPU_LINK_ANNOTATION, LOSS_ANNOTATION, SCORE_ANNOTATION

SGPU, GPU = "Metax-SGPU", "Metax-GPU"
QOS, APP, ALLOCATED = (
    "metax-tech.com/sgpu-qos-policy",
    "metax-tech.com/sgpu-app-class",
    "metax-tech.com/gpu-devices-allocated",
)
BINPACK, SPREAD = SchedulingPolicy(node="binpack"), SchedulingPolicy(node="spread")


def plugins(**config: object) -> VendorPlugins:
    return VendorPlugins.from_plugins({"metax": plugin}, config={"metax": dict(config)})


def req(count: int = 1, memory: int = 8192, cores: int = 30, kind: str = SGPU) -> ContainerRequest:
    if cores >= 100 and memory == 0:
        return ContainerRequest(kind=kind, count=count, memory_percentage=100, cores=100)
    return ContainerRequest(kind=kind, count=count, memory=memory, cores=cores)


def card(i: int, zone: int = 0, used: int = 0, usedmem: int = 0, usedcores: int = 0, qos: str = "") -> DeviceUsage:
    device = Device(
        id=f"GPU-{i}",
        index=i,
        count=16,
        devmem=65536,
        devcore=100,
        type=SGPU,
        custom={"QosPolicy": qos, "Model": "MXC500", "LinkZone": zone},
    )
    return DeviceUsage(device=device, used=used, usedmem=usedmem, usedcores=usedcores)


def placed(name: str, cards: Sequence[tuple[str, int]], **annotations: str) -> PlacedPod:
    allocated = json.dumps([[{"uuid": u, "compute": c, "vRam": 8192} for u, c in cards]])
    return PlacedPod(namespace="ml", name=name, annotations={ALLOCATED: allocated, **annotations})


def node(name: str, devices: list[DeviceUsage], pods: Sequence[PlacedPod] = (), **annotations: str) -> NodeView:
    return NodeView(name=name, devices=devices, pods={f"ml/{p.name}": p for p in pods}, annotations=annotations)


def pod(annotations: Mapping[str, str] | None = None) -> Pod:
    return Pod(name="p", namespace="ml", annotations=dict(annotations or {}), containers=(Container(name="c"),))


def chosen(fits: Sequence[NodeFit]) -> list[list[str]]:
    return [[d.uuid for d in fit.placement[0]] if fit.placement else [fit.reason] for fit in fits]


def fit(
    nodes: list[NodeView],
    request: ContainerRequest,
    annotations: Mapping[str, str] | None = None,
    policy: SchedulingPolicy = BINPACK,
    h: VendorPlugins | None = None,
) -> list[NodeFit]:
    return (h or plugins()).fit_nodes(request.kind, pod(annotations), [request], nodes, policy)


# ------------------------------------------------------------------------------------------------ shared cards


def test_a_busy_card_takes_only_shares_of_its_qos_policy() -> None:
    busy = node(
        "n", [card(0, used=1, usedmem=8192, usedcores=30)], [placed("a", [("GPU-0", 30)], **{QOS: "fixed-share"})]
    )
    assert chosen(fit([busy], req(), {QOS: "fixed-share"})) == [["GPU-0"]]
    (reason,) = chosen(fit([busy], req(), {QOS: "burst-share"}))[0]
    assert "QoS policy mismatch" in reason
    # a pod asking for a whole card's compute is not checked (and an idle card takes any policy)
    assert chosen(fit([node("n", [card(0)])], req(), {QOS: "burst-share"})) == [["GPU-0"]]


def test_the_nodes_published_policy_counts_when_no_pod_says() -> None:
    busy = node("n", [card(0, used=1, usedmem=8192, usedcores=30, qos="burst-share")])
    assert "QoS policy mismatch" in chosen(fit([busy], req(), {QOS: "fixed-share"}))[0][0]
    assert chosen(fit([busy], req(), {QOS: "burst-share"})) == [["GPU-0"]]


def test_app_classes_keep_to_their_cards() -> None:
    unclassed = node("u", [card(0, used=1, usedmem=8192, usedcores=30)], [placed("a", [("GPU-0", 30)])])
    offline = node(
        "o", [card(0, used=1, usedmem=8192, usedcores=30)], [placed("b", [("GPU-0", 30)], **{APP: "offline"})]
    )
    online = node("on", [card(0, used=1, usedmem=8192)], [placed("c", [("GPU-0", 0)], **{APP: "online"})])
    nodes = [unclassed, offline, online]
    assert [f.fits for f in fit(nodes, req())] == [True, False, False]
    assert [f.fits for f in fit(nodes, req(), {APP: "offline"})] == [False, True, False]  # no offline after online
    assert [f.fits for f in fit(nodes, req(), {APP: "online"})] == [False, True, True]


def test_an_online_pod_gets_no_compute_and_fits_a_card_whose_compute_is_taken() -> None:
    full = node(
        "n", [card(0, used=1, usedmem=8192, usedcores=100)], [placed("b", [("GPU-0", 100)], **{APP: "offline"})]
    )
    (result,) = fit([full], req(cores=100), {APP: "online"})
    assert result.placement is not None
    assert [(d.uuid, d.usedmem, d.usedcores) for d in result.placement[0]] == [("GPU-0", 8192, 0)]
    assert json.loads(result.pod_annotations[ALLOCATED]) == [[{"uuid": "GPU-0", "vRam": 8192}]]


def test_online_pods_prefer_cards_with_fewer_online_pods_and_avoid_offline_only_cards() -> None:
    cards = [card(0, used=1, usedmem=1024), card(1, used=2, usedmem=1024), card(2, used=1, usedmem=1024)]
    pods = [
        placed("a", [("GPU-0", 0)], **{APP: "offline"}),
        placed("b", [("GPU-1", 0)], **{APP: "online"}),
        placed("c", [("GPU-1", 0)], **{APP: "offline"}),
        placed("d", [("GPU-2", 0)], **{APP: "online"}),
    ]
    assert chosen(fit([node("n", cards, pods)], req(cores=0), {APP: "online"})) == [["GPU-2"]]


def test_exclusive_shares_stay_within_one_metaxlink_group() -> None:
    # zone 1 holds three cards, zone 2 two: two whole cards come from the smallest group that holds them
    cards = [card(0, 1), card(1, 1), card(2, 1), card(3, 2), card(4, 2), card(5, 0)]
    assert chosen(fit([node("n", cards)], req(2, memory=0, cores=100))) == [["GPU-4", "GPU-3"]]  # walk order
    assert chosen(fit([node("n", cards)], req(3, memory=0, cores=100))) == [["GPU-2", "GPU-1", "GPU-0"]]
    # four need two groups; unlinked cards come last
    assert sorted(chosen(fit([node("n", cards)], req(4, memory=0, cores=100)))[0]) == [
        "GPU-1",
        "GPU-2",
        "GPU-3",
        "GPU-4",
    ]


def test_placement_writes_metax_annotations() -> None:
    (result,) = fit([node("n", [card(0)])], req(memory=8192, cores=30))
    annotations = result.pod_annotations
    assert json.loads(annotations[ALLOCATED]) == [[{"uuid": "GPU-0", "compute": 30, "vRam": 8192}]]
    assert int(annotations["metax-tech.com/predicate-time"]) > 1_700_000_000 * 10**9  # nanoseconds
    assert annotations[QOS] == "best-effort"


def test_topology_aware_score_prefers_placements_that_keep_links_whole() -> None:
    h = plugins(sgpuTopologyAware=True)
    # node a: two idle cards on one link; node b: the same plus two more of another group
    a = node("a", [card(0, 1), card(1, 1)])
    b = node("b", [card(0, 1), card(1, 1), card(2, 2), card(3, 2)])
    fits = fit([a, b], req(2, memory=0, cores=100), h=h)
    scores = h.score_nodes(SGPU, pod(), fits, {"a": a, "b": b}, BINPACK)
    assert scores is not None
    assert scores["a"] == fits[0].score + 10000 * 100  # 10 × 10 taken, nothing lost
    assert scores["b"] == fits[1].score + 10000 * 100
    spread = h.score_nodes(SGPU, pod(), fits, {"a": a, "b": b}, SPREAD)
    assert spread is not None
    assert spread["a"] == fits[0].score - 10000 * 100
    # off by default, and a pod may turn it off
    assert plugins().score_nodes(SGPU, pod(), fits, {"a": a, "b": b}, BINPACK) == {
        "a": fits[0].score,
        "b": fits[1].score,
    }
    off = pod({"metax-tech.com/sgpu-topology-aware": "false"})
    assert h.score_nodes(SGPU, off, fits, {"a": a, "b": b}, BINPACK) == {"a": fits[0].score, "b": fits[1].score}


def test_online_score_counts_the_cards_pods() -> None:
    n = node(
        "n",
        [card(0, used=2, usedmem=2048)],
        [placed("x", [("GPU-0", 0)], **{APP: "offline"}), placed("y", [("GPU-0", 0)], **{APP: "offline"})],
    )
    fits = fit([n], req(cores=0), {APP: "online"})
    scores = plugins().score_nodes(SGPU, pod({APP: "online"}), fits, {"n": n}, BINPACK)
    assert scores == {"n": fits[0].score - 10000 * 200}


# ------------------------------------------------------------------------------------------------ whole cards


def whole(i: int, used: int = 0) -> DeviceUsage:
    return DeviceUsage(
        device=Device(id=f"GPU-{i}", index=i, count=1, devmem=65536, devcore=100, type="MXC500"),
        used=used,
        usedmem=65536 * used,
        usedcores=100 * used,
    )


def test_whole_cards_are_placed_over_metaxlink() -> None:
    links = {f"GPU-{a}": {f"GPU-{b}": 10 for b in (0, 2) if b != a} for a in (0, 2)}
    n = node("n", [whole(i) for i in range(4)], **{GPU_LINK_ANNOTATION: encode_link_scores(links)})
    assert chosen(fit([n], req(2, memory=0, cores=100, kind=GPU))) == [["GPU-2", "GPU-0"]]  # walk order
    # one card: the least connected, keeping the linked pair for a pod that needs it
    assert chosen(fit([n], req(1, memory=0, cores=100, kind=GPU)))[0][0] in ("GPU-1", "GPU-3")
    busy = node("b", [whole(0, 1), whole(1)], **{GPU_LINK_ANNOTATION: encode_link_scores(links)})
    assert chosen(fit([busy], req(2, memory=0, cores=100, kind=GPU)))[0][0].startswith("pod: needs 2")


def test_whole_card_score_reads_metax_losses_and_scores() -> None:
    tables = {LOSS_ANNOTATION: '{"1":0,"2":20}', SCORE_ANNOTATION: '{"1":0,"2":10}'}
    a = node("a", [whole(0), whole(1)], **tables)
    b = node("b", [whole(0), whole(1)])
    fits = fit([a, b], req(2, memory=0, cores=100, kind=GPU))
    h = plugins()
    assert h.score_nodes(GPU, pod(), fits, {"a": a, "b": b}, BINPACK) == {"a": fits[0].score + 1980, "b": fits[1].score}
    assert h.score_nodes(GPU, pod(), fits, {"a": a, "b": b}, SPREAD) == {"a": fits[0].score + 1990, "b": fits[1].score}


def test_placed_pods_device_strings_are_hamis() -> None:
    (result,) = fit([node("n", [card(0)])], req(memory=4096, cores=25))
    assert result.placement == ((ContainerDevice(uuid="GPU-0", type=SGPU, usedmem=4096, usedcores=25),),)
