"""Allocate and the container edits on an AMD node: HAMi's device nodes and variables, and its CU-mask split.

A fake MI300X node (conftest.py: fake AMD SMI, sysfs); each test allocates as the node daemon does (`hami_allocate`,
then `hami_container_edits`) and checks what the container gets.
"""

from __future__ import annotations

import json

import pytest

from hami.errors import HamiError
from hami.isolation.grant import parse as parse_grant
from hami.model import Container, ContainerDevice, ContainerEdits, Pod
from hami_vendor_amd.cumask import id_list, parse_id_list

MI300X = "AMD Instinct MI300X"


def pod(uid: str, *names: str, **annotations: str) -> Pod:
    return Pod(name=f"pod-{uid}", uid=uid, annotations=annotations,
               containers=tuple(Container(name=n) for n in names or ("main",)))  # fmt: skip


def the_grant(edits: ContainerEdits) -> str:
    (text,) = (text for name, text in edits.files.items() if name.endswith("/amd.grant"))
    return text


def grant(uuid: str, memory: int, units: int) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=uuid, type=MI300X, usedmem=memory, usedcores=units),)


@pytest.fixture
def node(amd, machine):
    a, b = amd.gpu(0), amd.gpu(1)
    built = machine(a, b)
    plugins = amd.plugins(built.config())
    plugins.discover()
    return plugins, a, b, built


def test_a_share_gets_hamis_devices_variables_and_its_own_compute_units(node):
    plugins, a, _, built = node
    p = pod("u1")
    allocation = plugins.allocate("AMD", p, 0, grant(a.uuid, 16384, 76))
    assert json.loads(allocation.pod_annotations["hami.io/amd-cu-allocated"]) == {a.uuid: "0-75"}
    edits = plugins.container_edits("AMD", p, 0, grant(a.uuid, 16384, 76))
    assert [(d.container_path, d.permissions) for d in edits.devices] == [
        ("/dev/kfd", "rw"), ("/dev/dri/card1", "rw"), ("/dev/dri/renderD129", "rw")]  # fmt: skip
    env = dict(edits.env)
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-49a1c06b3b2d8f00"
    assert env["HSA_CU_MASK"] == "0:0-75"
    assert env["HIP_DEVICE_MEMORY_LIMIT"] == "16384m"
    assert env["HIP_DEVICE_MEMORY_LIMIT_0"] == "16384m"
    assert env["HIP_DEVICE_CORE_LIMIT_0"] == "0"  # the CU mask is the compute share: no time slicing on top
    assert env["HIP_DEVICE_UUIDS"] == a.uuid
    mounts = {m.container_path: m for m in edits.mounts}
    assert mounts["/etc/hami/grant"].read_only
    assert not mounts["/hami-amd-shmem"].read_only
    assert mounts["/hami-amd-shmem"].host_path == str(built.root / "hook" / "containers" / "u1_main")
    limits = parse_grant(the_grant(edits))
    assert [(d.memory_bytes, d.cores, d.uuid) for d in limits.devices] == [(16384 << 20, 0, a.uuid)]


def test_containers_sharing_a_gpu_get_disjoint_units_and_a_release_frees_them(node):
    plugins, a, _, _ = node
    first, second, third = pod("u1"), pod("u2", "x", "y"), pod("u3")
    plugins.allocate("AMD", first, 0, grant(a.uuid, 1000, 76))
    plugins.allocate("AMD", second, 0, grant(a.uuid, 1000, 100))
    allocation = plugins.allocate("AMD", second, 1, grant(a.uuid, 1000, 3))
    # the pod's annotation merges its containers' units per GPU, as HAMi's plugin writes it
    assert json.loads(allocation.pod_annotations["hami.io/amd-cu-allocated"]) == {a.uuid: "76-178"}
    assert dict(plugins.container_edits("AMD", second, 0, grant(a.uuid, 1000, 100)).env)["HSA_CU_MASK"] == "0:76-175"
    assert dict(plugins.container_edits("AMD", second, 1, grant(a.uuid, 1000, 3)).env)["HSA_CU_MASK"] == "0:176-178"
    plugins.release("AMD", first, [grant(a.uuid, 1000, 76)])
    plugins.allocate("AMD", third, 0, grant(a.uuid, 1000, 80))
    assert (
        dict(plugins.container_edits("AMD", third, 0, grant(a.uuid, 1000, 80)).env)["HSA_CU_MASK"] == "0:0-75,179-182"
    )


def test_a_retried_allocate_finds_the_same_units(node):
    plugins, a, _, _ = node
    p = pod("u1")
    once = plugins.allocate("AMD", p, 0, grant(a.uuid, 1000, 50))
    again = plugins.allocate("AMD", p, 0, grant(a.uuid, 1000, 50))
    assert once == again


def test_several_gpus_are_numbered_in_the_placements_order(node):
    plugins, a, b, _ = node
    p = pod("u1")
    placement = (ContainerDevice(uuid=b.uuid, type=MI300X, usedmem=2000, usedcores=304),
                 ContainerDevice(uuid=a.uuid, type=MI300X, usedmem=1000, usedcores=76))  # fmt: skip
    plugins.allocate("AMD", p, 0, placement)
    env = dict(plugins.container_edits("AMD", p, 0, placement).env)
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-49a1c06b3b2d8f01,GPU-49a1c06b3b2d8f00"
    assert env["HSA_CU_MASK"] == "0:0-303;1:0-75"
    assert env["HIP_DEVICE_MEMORY_LIMIT"] == "2000m"  # HAMi's variable: the first GPU's
    assert (env["HIP_DEVICE_MEMORY_LIMIT_0"], env["HIP_DEVICE_MEMORY_LIMIT_1"]) == ("2000m", "1000m")


def test_a_tenants_patched_annotation_does_not_move_anyone_elses_units(node):
    """The record is the node's: a pod claiming units in its own hami.io/amd-cu-allocated changes nothing."""
    plugins, a, _, _ = node
    liar = pod("u1", **{"hami.io/amd-cu-allocated": json.dumps({a.uuid: "0-303"})})
    plugins.allocate("AMD", liar, 0, grant(a.uuid, 1000, 10))
    honest = pod("u2")
    plugins.allocate("AMD", honest, 0, grant(a.uuid, 1000, 10))
    assert dict(plugins.container_edits("AMD", honest, 0, grant(a.uuid, 1000, 10)).env)["HSA_CU_MASK"] == "0:10-19"


def test_edits_before_allocate_are_refused_under_a_cu_mask(node):
    plugins, a, _, _ = node
    with pytest.raises(HamiError, match="Allocate must run first"):
        plugins.container_edits("AMD", pod("u9"), 0, grant(a.uuid, 1000, 10))


def test_more_units_than_are_free_is_refused_saying_the_views_disagree(node):
    plugins, a, _, _ = node
    plugins.allocate("AMD", pod("u1"), 0, grant(a.uuid, 1000, 300))
    with pytest.raises(HamiError, match="has 4 free compute units on this node and the container was granted 10"):
        plugins.allocate("AMD", pod("u2"), 0, grant(a.uuid, 1000, 10))


def test_after_a_restart_the_units_of_pods_gone_are_free(node):
    plugins, a, _, _ = node
    stays, gone = pod("u1"), pod("u2")
    plugins.allocate("AMD", stays, 0, grant(a.uuid, 1000, 100))
    plugins.allocate("AMD", gone, 0, grant(a.uuid, 1000, 100))
    plugins.reconcile("AMD", [stays])
    plugins.allocate("AMD", pod("u3"), 0, grant(a.uuid, 1000, 204))
    assert (
        dict(plugins.container_edits("AMD", pod("u3"), 0, grant(a.uuid, 1000, 204)).env)["HSA_CU_MASK"] == "0:100-303"
    )


def test_time_slice_mode_limits_device_time_instead_of_masking(amd, machine):
    a = amd.gpu(0)
    plugins = amd.plugins(machine(a).config(coreSplit="time-slice"))
    plugins.discover()
    p = pod("u1")
    allocation = plugins.allocate("AMD", p, 0, grant(a.uuid, 1000, 100))  # 33 % of 304 units
    assert not allocation.pod_annotations
    edits = plugins.container_edits("AMD", p, 0, grant(a.uuid, 1000, 100))
    assert "HSA_CU_MASK" not in edits.env
    assert edits.env["HIP_DEVICE_CORE_LIMIT_0"] == "33"
    assert [d.cores for d in parse_grant(the_grant(edits)).devices] == [33]


def test_a_host_process_sees_the_placed_gpus_through_rocr(node):
    plugins, a, b, _ = node
    placement = grant(b.uuid, 1000, 10) + grant(a.uuid, 1000, 10)
    assert plugins.host_environment("AMD", placement, [2, 1]) == {
        "ROCR_VISIBLE_DEVICES": "GPU-49a1c06b3b2d8f01,GPU-49a1c06b3b2d8f00"
    }


@pytest.mark.parametrize(
    ("units", "text"), [([0, 1, 2, 3, 8, 10, 11, 12], "0-3,8,10-12"), ([5], "5"), ([], ""), ([3, 1, 2], "1-3")]
)
def test_cu_id_lists_are_rocrs_grammar(units, text):
    assert id_list(units) == text
    assert parse_id_list(text) == set(units)
