"""Pod annotations carried by fits: written with the placement, seen by later fits through the node views
(assumed or watched), and rebuilt from the pods after a restart. The scripted vendor's `reserve` knob stands in
for a vendor with partition reservations: each fit reserves its devices in a pod annotation, and no fit takes
a device another pod counted on the node has reserved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import scripted_vendor
from node_harness import scripted_devices, write_script
from scheduler_harness import Harness

from hami.cluster import meta
from hami.codec import encode_node_register
from hami.model import ContainerDevice, Device
from hami.plugins import VendorPlugins
from hami.scheduler.extender import FilterResult
from hami.scheduler.state import ClusterState

RESERVED = scripted_vendor.RESERVED
ALLOCATED = "hami.io/scripted-devices-allocated"


def scripted_node(name: str, devices: int = 2) -> dict[str, Any]:
    register = encode_node_register(
        [Device(id=f"SCR-{i}", index=i, count=4, devmem=8192, type="Scripted") for i in range(devices)]
    )
    return {"metadata": {"name": name, "annotations": {"hami.io/node-scripted-register": register}}}


def scripted_pod(name: str, memory: int = 1000) -> dict[str, Any]:
    limits = {"scripted.example/accel": "1", "scripted.example/accel-memory": str(memory)}
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "annotations": {"hami.io/gpu-scheduler-policy": "binpack"},  # the busiest device; ties: the highest index
        },
        "spec": {"schedulerName": "hami-scheduler", "containers": [{"name": "main", "resources": {"limits": limits}}]},
        "status": {"phase": "Pending"},
    }


@pytest.fixture
def reserving(harness: Harness, tmp_path: Path) -> Harness:
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2)}, reserve=True)
    harness.plugins = VendorPlugins.from_plugins(
        {"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}}
    )
    harness.add_node(scripted_node("node-a"))
    for name in ("first", "second", "third"):
        harness.add_pod(scripted_pod(name))
    return harness.start()


def annotations_of(h: Harness, pod: str) -> dict[str, str]:
    h.flush()  # the decision is written in the background, before the pod's bind
    return dict(meta(h.cluster.get("pods", pod, "default")).get("annotations") or {})


def view_pods(h: Harness, node: str = "node-a") -> dict[str, dict[str, str]]:
    assert h.service is not None
    with h.service.state.lock:
        pods = h.service.state.nodes[node].views["Scripted"].pods
        return {key: dict(p.annotations) for key, p in pods.items()}


def test_a_fits_annotations_are_written_with_the_placement(reserving: Harness) -> None:
    assert reserving.filter("first")["NodeNames"] == ["node-a"]
    got = annotations_of(reserving, "first")
    assert got[RESERVED] == "SCR-1"
    assert got[ALLOCATED] == "SCR-1,Scripted,1000,0:;"
    assert got["hami.io/vgpu-node"] == "node-a"


def test_the_next_fit_sees_the_previous_pods_reservation_at_once(reserving: Harness) -> None:
    reserving.filter("first")
    reserving.filter("second")  # no flush: the watch may not have delivered the first pod's annotations yet
    assert annotations_of(reserving, "second")[RESERVED] == "SCR-0"
    answer = reserving.filter("third")
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"] == {"node-a": "pod: needs 1 Scripted device, 0/2 usable (2 reserved by another pod)"}


def test_the_pods_own_update_replaces_the_assumed_annotations(reserving: Harness) -> None:
    reserving.filter("first")
    reserving.flush()
    seen = view_pods(reserving)["default/first"]
    assert seen == annotations_of(reserving, "first")
    assert seen[ALLOCATED] == "SCR-1,Scripted,1000,0:;"


def test_a_restart_rebuilds_the_same_reservations_from_the_pods(reserving: Harness) -> None:
    reserving.filter("first")
    reserving.filter("second")
    reserving.flush()
    before = view_pods(reserving)
    assert reserving.service is not None
    usage = reserving.service.state.usage_snapshot()
    reserving.restart()
    assert view_pods(reserving) == before
    assert reserving.service.state.usage_snapshot() == usage
    assert reserving.filter("third")["FailedNodes"] == {
        "node-a": "pod: needs 1 Scripted device, 0/2 usable (2 reserved by another pod)"
    }


def test_a_deleted_pod_leaves_the_node_view_and_frees_its_reservation(reserving: Harness) -> None:
    reserving.filter("first")
    reserving.filter("second")
    reserving.flush()
    reserving.cluster.delete("pods", "first", "default")
    reserving.flush()
    assert set(view_pods(reserving)) == {"default/second"}
    assert reserving.filter("third")["NodeNames"] == ["node-a"]
    assert annotations_of(reserving, "third")[RESERVED] == "SCR-1"


def test_the_placements_own_annotations_win_over_a_fits(reserving: Harness) -> None:
    assert reserving.service is not None
    extender = reserving.service.extender
    original = extender.plugins.fit_nodes

    def clashing(*args: Any, **kwargs: Any) -> Any:
        fits = original(*args, **kwargs)
        return [f.model_copy(update={"pod_annotations": {ALLOCATED: "bogus", "hami.io/vgpu-node": "x"}}) for f in fits]

    extender.plugins.fit_nodes = clashing  # type: ignore[method-assign]
    result: FilterResult = extender.filter(reserving.cluster.get("pods", "first", "default"), ["node-a"])
    assert result.node == "node-a"
    got = annotations_of(reserving, "first")
    assert (got[ALLOCATED], got["hami.io/vgpu-node"]) == ("SCR-1,Scripted,1000,0:;", "node-a")


# ------------------------------------------------------------------------------------------------------
# The state's node views, directly
# ------------------------------------------------------------------------------------------------------


def placed(uuid: str) -> tuple[tuple[ContainerDevice, ...], ...]:
    return ((ContainerDevice(uuid=uuid, type="Scripted", usedmem=1000, usedcores=0),),)


def test_an_assumed_pod_is_listed_with_the_annotations_its_decision_wrote() -> None:
    state = ClusterState(VendorPlugins.from_plugins({"scripted": scripted_vendor}))
    state.set_node(scripted_node("node-a"))
    state.assume("default", "first", "uid-1", "node-a", 0, {"Scripted": placed("SCR-0")}, {RESERVED: "SCR-0"})
    view = state.nodes["node-a"].views["Scripted"]
    (pod,) = view.pods.values()
    assert (pod.namespace, pod.name, pod.uid, dict(pod.annotations)) == (
        "default",
        "first",
        "uid-1",
        {RESERVED: "SCR-0"},
    )
    assert [u.used for u in view.devices] == [1, 0]

    obj = scripted_pod("first")
    obj["metadata"]["annotations"].update(
        {ALLOCATED: "SCR-0,Scripted,1000,0:;", RESERVED: "SCR-0", "hami.io/vgpu-node": "node-a"}
    )
    state.set_pod(obj)  # the pod's own update: every annotation, the same usage
    assert view.pods["default/first"].annotations[ALLOCATED] == "SCR-0,Scripted,1000,0:;"
    assert [u.used for u in view.devices] == [1, 0]

    state.set_node(scripted_node("node-a"))  # a node update builds new views and counts the pods again
    assert set(state.nodes["node-a"].views["Scripted"].pods) == {"default/first"}
    state.remove_pod("default", "first")
    assert state.nodes["node-a"].views["Scripted"].pods == {}
