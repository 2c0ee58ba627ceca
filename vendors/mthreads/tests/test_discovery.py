"""Discovery through the fake libmtml.so, and through a fake mthreads-gmi without it; registration as HAMi reads it
(node capacity) and as this scheduler reads it (the per-GPU register)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.codec import decode_link_scores, decode_node_register, encode_node_register
from hami.node.devices import ResourceRole, advertised_devices, resources_of
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_mthreads import gmi, plugin
from hami_vendor_mthreads.discovery import REGISTER_ANNOTATION, SCORE_ANNOTATION, runtime_for

MakeNode = Callable[[list[Any]], Any]
F = Any
MIB = 1024 * 1024


def found(node: Any, source: str = "mtml", **extra: object) -> list[Any]:
    inventories = node.plugins(source, **extra).discover()["mthreads"]
    return list(inventories[0].devices) if inventories else []


def test_mtml_discovery(fakes: F, mthreads_node: MakeNode) -> None:
    gpus = [*fakes.s4000_server(2), fakes.Gpu(bus=0x60, uuid="1d2e3f40-aaaa-4bbb-8ccc-000000000009",
                                              name="MTT S80", total=16 * fakes.GIB, numa=1, switch=7)]  # fmt: skip
    devices = found(mthreads_node(gpus))
    assert [d.id for d in devices] == [g.uuid for g in gpus]
    assert [d.type for d in devices] == ["Mthreads-MTT-S4000", "Mthreads-MTT-S4000", "Mthreads-MTT-S80"]
    # HAMi v2.10 reads Mthreads devices from the node's capacity, typed `Mthreads`; this project's scheduler reads
    # the register, and its types pass HAMi's getNodeResources rule too
    assert counted_by_hami((d.type for d in devices), "Mthreads")
    assert [(d.index, d.count, d.devmem, d.devcore, d.numa, d.health) for d in devices] == [
        (0, 100, 49152, 16, 0, True),
        (1, 100, 49152, 16, 0, True),
        (2, 100, 16384, 16, 1, True),
    ]
    # this scheduler decodes the per-GPU register the daemon publishes
    assert plugin.KIND.annotations.node_register == REGISTER_ANNOTATION
    assert [d.id for d in decode_node_register(encode_node_register(devices))] == [g.uuid for g in gpus]


def test_runtime_keeps_paths_pci_address_and_cores(fakes: F, mthreads_node: MakeNode) -> None:
    plugins = mthreads_node(fakes.s4000_server(2)).plugins()
    plugins.discover()
    runtime = runtime_for(plugins.vendors[0].settings)
    assert runtime.source == "mtml"
    second = runtime.gpus[1]
    assert (second.bdf, second.cores) == ("0000:3b:00.0", 8)
    assert (second.gpu_path, second.primary_path, second.render_path) == (
        "/dev/mtgpu.1",
        "/dev/dri/card2",
        "/dev/dri/renderD129",
    )


def test_every_mtml_object_is_freed(fakes: F, mthreads_node: MakeNode, fake_mtml: Any) -> None:
    lib = ctypes.CDLL(str(fake_mtml))  # the same library the binding loaded (one copy per process)
    before = lib.fake_mtml_live_objects()
    plugins = mthreads_node(fakes.s4000_server(3)).plugins()
    plugins.discover()
    plugins.discover()
    assert lib.fake_mtml_live_objects() == before + 1  # the session's library object; devices and memory freed
    runtime_for(plugins.vendors[0].settings).mtml.close()  # type: ignore[union-attr]
    assert lib.fake_mtml_live_objects() == before


def test_topology_levels_become_link_scores(fakes: F, mthreads_node: MakeNode) -> None:
    gpus = fakes.s4000_server(4)  # 0,1 on one switch (NUMA 0), 2,3 on another (NUMA 1)
    (inventory,) = mthreads_node(gpus).plugins().discover()["mthreads"]
    scores = decode_link_scores(inventory.annotations[SCORE_ANNOTATION])
    a, b, c, _ = (g.uuid for g in gpus)
    assert scores[a][b] == 50  # MTML_TOPOLOGY_SINGLE
    assert scores[a][c] == 10  # MTML_TOPOLOGY_SYSTEM
    assert a not in scores[a]


def test_mpc_parent_is_not_a_gpu_but_its_instances_are(fakes: F, mthreads_node: MakeNode) -> None:
    parent = fakes.Gpu(bus=0x3A, uuid="aaaaaaaa-0000-4000-8000-00000000000p", mpc=1)
    instances = [replace(parent, uuid=f"aaaaaaaa-0000-4000-8000-00000000000{i}", mpc=2, total=24 * fakes.GIB)
                 for i in range(2)]  # fmt: skip
    devices = found(mthreads_node([parent, *instances]))
    assert [d.id for d in devices] == [g.uuid for g in instances]
    assert [d.devmem for d in devices] == [24576, 24576]


def test_device_without_uuid_is_left_out_and_others_served(fakes: F, mthreads_node: MakeNode) -> None:
    gpus = fakes.s4000_server(3)
    gpus[1] = replace(gpus[1], uuid="")
    node = mthreads_node(gpus)
    plugins = node.plugins()
    devices = list(plugins.discover()["mthreads"][0].devices)
    assert [d.id for d in devices] == [gpus[0].uuid, gpus[2].uuid]
    assert any("empty UUID" in p for p in runtime_for(plugins.vendors[0].settings).problems)


def test_device_whose_memory_cannot_be_read_is_unhealthy(
    fakes: F, mthreads_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = mthreads_node(fakes.s4000_server(3))
    monkeypatch.setenv("FAKE_MTML_FAIL", "mtmlDeviceInitMemory:1")
    devices = found(node)
    assert [d.health for d in devices] == [True, False, True]


def test_gmi_is_read_where_mtml_is_absent(fakes: F, mthreads_node: MakeNode) -> None:
    node = mthreads_node(fakes.s4000_server(3))
    mtml = found(node)
    tool = found(node, "gmi")
    assert [(d.id, d.devmem, d.type, d.index) for d in tool] == [(d.id, d.devmem, d.type, d.index) for d in mtml]
    plugins = node.plugins("gmi")
    plugins.discover()
    runtime = runtime_for(plugins.vendors[0].settings)
    assert runtime.source == "mthreads-gmi"
    assert runtime.gpus[0].bdf == "0000:3a:00.0"


def test_mtml_failing_at_read_falls_back_to_gmi(
    fakes: F, mthreads_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = mthreads_node(fakes.s4000_server(2))
    monkeypatch.setenv("FAKE_MTML_FAIL", "mtmlLibraryCountDevice")
    plugins = node.plugins()
    assert len(plugins.discover()["mthreads"][0].devices) == 2
    assert runtime_for(plugins.vendors[0].settings).source == "mthreads-gmi"


def test_malformed_gmi_block_names_tool_and_line_and_keeps_the_others(fakes: F) -> None:
    text = fakes.gmi_output(fakes.s4000_server(3)).replace("Total             : 49152MiB", "Total : lots", 1)
    report = gmi.parse(text)
    assert [g.uuid for g in report.gpus] == [g.uuid for g in fakes.s4000_server(3)[1:]]
    (problem,) = report.problems
    bad_line = text.splitlines().index("        Total : lots") + 1
    assert problem.startswith(f"mthreads-gmi line {bad_line}: 'lots' is not a memory size")
    assert "GPU 0 is not reported" in problem


def test_gmi_block_without_uuid_is_named(fakes: F) -> None:
    text = "\n".join(line for line in fakes.gmi_output(fakes.s4000_server(1)).splitlines() if "UUID" not in line)
    report = gmi.parse(text)
    assert report.gpus == []
    assert "has no 'gpu uuid' field" in report.problems[0]


def test_gmi_without_gpu_blocks_is_an_error() -> None:
    with pytest.raises(gmi.GmiError, match="no GPU block"):
        gmi.parse("Mthreads GMI\nNo devices were found\n")


def test_neither_source_reports_no_gpu(mthreads_node: MakeNode, fakes: F) -> None:
    node = mthreads_node(fakes.s4000_server(1))
    assert node.plugins("gmi", mthreadsGmi=str(node.directory / "no-such-tool")).discover()["mthreads"] == []


def test_failing_tool_is_an_error(fakes: F, tmp_path: Any) -> None:
    script = fakes.write_gmi(tmp_path, "", exit_code=3)
    with pytest.raises(gmi.GmiError, match="exited with 3"):
        gmi.read_gpus(str(script))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("GPU0123 :\n\tabcMiB-.")), max_size=300))
def test_gmi_parser_never_raises_unexpectedly(text: str) -> None:
    try:
        report = gmi.parse(text)
    except gmi.GmiError:
        return
    assert all(p.startswith("mthreads-gmi") for p in report.problems)


def test_capacity_is_what_hamis_scheduler_reads(fakes: F, mthreads_node: MakeNode) -> None:
    devices = found(mthreads_node(fakes.s4000_server(2)))
    served = {r.name: r.role for r in resources_of(plugin.KIND)}
    assert served == {
        "mthreads.com/vgpu": ResourceRole.COUNT,
        "mthreads.com/sgpu-memory": ResourceRole.MEMORY,
        "mthreads.com/sgpu-core": ResourceRole.CORES,
    }
    cores = advertised_devices(plugin.KIND, ResourceRole.CORES, devices)
    memory = advertised_devices(plugin.KIND, ResourceRole.MEMORY, devices)
    assert len(cores) == 32  # 16 per GPU: HAMi counts the GPUs as ceil(cores / 16)
    assert len(memory) == 2 * 96  # 512 MiB units: 48 GiB each
    assert len(advertised_devices(plugin.KIND, ResourceRole.COUNT, devices)) == 2
    assert devices[0].devmem * MIB == 48 * fakes.GIB


def test_served_capacity_is_read_back_as_hami_reads_it(fakes: F, mthreads_node: MakeNode) -> None:
    from hami.scheduler.nodes import _devices_from_capacity

    devices = found(mthreads_node(fakes.s4000_server(3)))
    capacity = {r.name: str(len(advertised_devices(plugin.KIND, r.role, devices))) for r in resources_of(plugin.KIND)}
    assert capacity == {"mthreads.com/vgpu": "3", "mthreads.com/sgpu-memory": "288", "mthreads.com/sgpu-core": "48"}
    node = {"metadata": {"name": "mt-1"}, "status": {"capacity": capacity}}
    read = _devices_from_capacity(node, plugin.KIND)  # what HAMi v2.10's GetNodeDevices makes of it
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type) for d in read] == [
        (f"mt-1-mthreads-{i}", i, 100, 49152, 16, "Mthreads") for i in range(3)
    ]
