"""Dynamic sMLU on the node over the fake CNDev: the instance made at Allocate from the placement, found again on
a retry, destroyed at release (with its profile), cleaned up after a crash, and the refusals that say what to fix."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hami.errors import HamiError
from hami.model import ContainerDevice, Pod
from hami.plugins import VendorPlugins
from hami_vendor_cambricon.cndev import Cndev
from hami_vendor_cambricon.smlu import instance_name, owner_of

MachineHost = Callable[..., VendorPlugins]
UUIDS = [f"MLU-a1b2c3d4-0000-0000-0000-00000000000{i}" for i in range(4)]
POD_A = "0a1b2c3d-0000-4000-8000-00000000000a"
POD_B = "0a1b2c3d-0000-4000-8000-00000000000b"
MIB = 1024 * 1024


def pod(uid: str, containers: int = 1) -> Pod:
    return Pod.model_validate(
        {"name": f"p-{uid[-1]}", "uid": uid, "containers": [{"name": f"c{i}"} for i in range(containers)]}
    )


def share(card: int, memory: int = 4096, cores: int = 25) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=UUIDS[card], type="MLU", usedmem=memory, usedcores=cores),)


def driver(plugins: VendorPlugins) -> Cndev:
    """A second CNDev session on the same fake driver: what the driver holds, whoever made it."""
    return Cndev.open(plugins.vendor("cambricon").settings.cndev_library)


def test_a_share_gets_an_instance_of_exactly_its_size_and_a_retry_finds_it(mlu_node: MachineHost) -> None:
    plugins = mlu_node()
    first = plugins.allocate("MLU", pod(POD_A), 0, share(1, memory=4096, cores=25))
    again = plugins.allocate("MLU", pod(POD_A), 0, share(1, memory=4096, cores=25))  # the kubelet retried
    assert first.pod_annotations == again.pod_annotations
    (made,) = driver(plugins).instances(1)
    assert (made.name, made.quota, made.memory_bytes) == (f"hami-{POD_A}-0", 25, 4096 * MIB)
    assert made.device_node == "/dev/cambricon-caps/cap_dev1_mi1"
    assert [(p.quota, p.memory_bytes) for p in driver(plugins).profiles(1)] == [(25, 4096 * MIB)]


def test_whole_cards_need_no_instance(mlu_node: MachineHost) -> None:
    plugins = mlu_node()
    whole = (ContainerDevice(uuid=UUIDS[0], type="MLU", usedmem=24576, usedcores=100),
             ContainerDevice(uuid=UUIDS[1], type="MLU", usedmem=24576, usedcores=100))  # fmt: skip
    allocation = plugins.allocate("MLU", pod(POD_A), 0, whole)
    assert "CAMBRICON_DSMLU_PROFILE_INSTANCE" not in allocation.pod_annotations
    assert driver(plugins).instances(0) == driver(plugins).instances(1) == []
    assert plugins.container_edits("MLU", pod(POD_A), 0, whole, None).env == {"CAMBRICON_VISIBLE_DEVICES": "0,1"}


def test_a_second_share_of_the_same_size_reuses_the_profile_and_release_undoes_both(mlu_node: MachineHost) -> None:
    plugins = mlu_node()
    plugins.allocate("MLU", pod(POD_A), 0, share(2))
    plugins.allocate("MLU", pod(POD_B), 0, share(2))
    session = driver(plugins)
    assert sorted(i.name for i in session.instances(2)) == [f"hami-{POD_A}-0", f"hami-{POD_B}-0"]
    assert len(session.profiles(2)) == 1
    plugins.release("MLU", pod(POD_A), [share(2)])
    assert [i.name for i in session.instances(2)] == [f"hami-{POD_B}-0"]
    assert len(session.profiles(2)) == 1  # still used by B
    plugins.release("MLU", pod(POD_B), [share(2)])
    assert session.instances(2) == []
    assert session.profiles(2) == []  # the last instance gone, the profile too
    plugins.release("MLU", pod(POD_B), [share(2)])  # released twice, or never allocated: nothing to do


def test_the_container_gets_its_instance_as_cambricons_plugin_gives_it(mlu_node: MachineHost) -> None:
    plugins = mlu_node(cnmonPath="/usr/bin/cnmon")
    plugins.allocate("MLU", pod(POD_A), 0, share(3, memory=1024, cores=10))
    edits = plugins.container_edits("MLU", pod(POD_A), 0, share(3, memory=1024, cores=10), None)
    cap = "/dev/cambricon-caps/cap_dev3_mi1"
    assert edits.env == {"VIRTUAL_DEVICES": f"/dev/cambricon_dev3,/dev/cambricon_ipcm3,{cap}"}
    # /dev/cambricon_ipcm3 is given only where the host has it (this test machine has none)
    assert [d.host_path for d in edits.devices] == ["/dev/cambricon_dev3", cap, "/dev/cambricon_ctl"]
    assert [m.container_path for m in edits.mounts] == ["/usr/bin/cnmon"]
    with pytest.raises(HamiError, match=f"hami-{POD_B}-0 of this container is not on MLU 3"):
        plugins.container_edits("MLU", pod(POD_B), 0, share(3, memory=1024, cores=10), None)


def test_after_a_crash_the_instances_of_pods_gone_are_destroyed_and_others_kept(mlu_node: MachineHost) -> None:
    before = mlu_node()
    before.allocate("MLU", pod(POD_A), 0, share(0))
    before.allocate("MLU", pod(POD_B), 0, share(0, memory=2048, cores=50))
    session = driver(before)
    foreign = session.create_instance(0, session.create_profile(0, 10, 256 * MIB), "made-by-an-admin")
    # the daemon restarts (a new host, the same driver); pod A was deleted while it was down
    after = mlu_node()
    after.reconcile("MLU", [pod(POD_B)])
    left = {i.name: i.handle for i in session.instances(0)}
    assert left == {f"hami-{POD_B}-0": left[f"hami-{POD_B}-0"], "made-by-an-admin": foreign}
    assert sorted(p.quota for p in session.profiles(0)) == [10, 50]  # A's profile went with its instance


def test_an_allocate_that_died_half_way_is_finished_by_the_retry(mlu_node: MachineHost) -> None:
    # The first daemon made the profile and the instance, then died before answering the kubelet.
    plugins = mlu_node()
    session = driver(plugins)
    session.create_instance(1, session.create_profile(1, 25, 4096 * MIB), instance_name(POD_A, 0))
    allocation = mlu_node().allocate("MLU", pod(POD_A), 0, share(1))
    assert allocation.pod_annotations["CAMBRICON_DSMLU_PROFILE_INSTANCE"] == "1_257_1_1"
    assert len(session.instances(1)) == 1


def test_refusals_say_what_to_fix(mlu_node: MachineHost) -> None:
    cards = [("u-0", "MLU370-X8", 24576, 8, 1, 0), ("u-1", "MLU370-X8", 24576, 8, 1, 1)]
    plugins = mlu_node(cards)
    on = (ContainerDevice(uuid="MLU-u-1", type="MLU", usedmem=4096, usedcores=60),)
    off = (ContainerDevice(uuid="MLU-u-0", type="MLU", usedmem=4096, usedcores=25),)
    with pytest.raises(HamiError, match=r"MLU 0 \(MLU-u-0\) is not in sMLU mode.*ask for whole cards"):
        plugins.allocate("MLU", pod(POD_A), 0, off)
    plugins.allocate("MLU", pod(POD_A), 0, on)
    with pytest.raises(HamiError, match=r"no room left for another sMLU of 60 % and 4096 MiB"):
        plugins.allocate("MLU", pod(POD_B), 0, on)  # 60 % + 60 % > 100 %
    bigger = (ContainerDevice(uuid="MLU-u-1", type="MLU", usedmem=4096, usedcores=50),)
    with pytest.raises(HamiError, match=r"making an sMLU of 50 % .* failed: .*code 9 \(insufficient space\)"):
        plugins.allocate("MLU", pod(POD_B), 0, bigger)
    zero = (ContainerDevice(uuid="MLU-u-1", type="MLU", usedmem=256, usedcores=0),)
    with pytest.raises(HamiError, match="compute quota of 1 to 100 percent, not 0"):
        plugins.allocate("MLU", pod(POD_B), 0, zero)
    with pytest.raises(HamiError, match="not of Kubernetes' form"):
        plugins.allocate("MLU", pod("../../x"), 0, on)


def test_a_driver_without_smlu_refuses_shares_and_serves_whole_cards(mlu_node: MachineHost) -> None:
    plugins = mlu_node(variant="old")
    with pytest.raises(HamiError, match="not in sMLU mode"):
        plugins.allocate("MLU", pod(POD_A), 0, share(0))
    plugins.allocate("MLU", pod(POD_A), 0, (ContainerDevice(uuid=UUIDS[0], type="MLU", usedmem=24576, usedcores=100),))
    plugins.release("MLU", pod(POD_A), [share(0)])


@given(uid=st.from_regex(r"[0-9a-z][0-9a-z-]{0,40}", fullmatch=True), index=st.integers(0, 999))
def test_instance_names_belong_to_their_pod_only(uid: str, index: int) -> None:
    assert owner_of(instance_name(uid, index)) == uid


@given(name=st.text(max_size=120))
def test_any_instance_name_is_ours_or_not(name: str) -> None:
    owner = owner_of(name)
    assert owner is None or name.startswith(f"hami-{owner}-")
