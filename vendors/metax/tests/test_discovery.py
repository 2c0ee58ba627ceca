"""Discovery through the fake MXSML library, and through a fake mx-smi without it; registration in the forms
HAMi's scheduler reads (MetaX's ``metax-tech.com/node-gpu-devices``, the ``metax-tech.com/gpu`` capacity and
MetaX's topology losses and scores)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.codec import decode_link_scores
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_metax import discovery, mxsmi
from hami_vendor_metax.node import runtime_for

MakeNode = Callable[[list[Any]], Any]
F = Any


def found(node: Any, source: str = "mxsml", **extra: object) -> list[Any]:
    return list(node.plugins(source, **extra).discover().get("metax", []))


def sgpu_entries(node: Any, source: str = "mxsml", **extra: object) -> list[dict[str, Any]]:
    (inventory,) = found(node, source, **extra)
    return json.loads(inventory.annotations[discovery.SGPU_ANNOTATION])  # type: ignore[no-any-return]


def test_mxsml_discovery_is_metax_sgpu_annotation(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(2, links=[1, 1])
    gpus[1] = replace(gpus[1], used=fakes.GIB)
    entries = sgpu_entries(metax_node(gpus))
    assert entries[0] == {
        "uuid": gpus[0].uuid,
        "bdf": "0000:10:00.0",
        "model": "MXC500",
        "totalDevCount": 16,
        "totalCompute": 100,
        "totalVRam": 65536,
        "availableDevCount": 16,
        "availableCompute": 100,
        "availableVRam": 65536,
        "healthy": True,
        "linkZone": 1,
    }  # numa 0 and the empty qosPolicy are left out, as Go's omitempty does
    assert [e["uuid"] for e in entries] == [g.uuid for g in gpus]


def test_hamis_reading_of_the_annotation(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(4, links=[2, 0, 2, 0])
    (inventory,) = found(metax_node(gpus), sgpuCount=8)
    devices = discovery.read_sgpu_devices(inventory.annotations)
    assert [(d.id, d.index, d.count, d.devmem, d.devcore, d.type, d.health) for d in devices] == [
        (g.uuid, i, 8, 65536, 100, "Metax-SGPU", True) for i, g in enumerate(gpus)
    ]
    assert [d.custom["LinkZone"] for d in devices] == [1, 0, 1, 0]
    assert [d.custom["Model"] for d in devices] == ["MXC500"] * 4
    assert list(inventory.devices) == devices
    assert counted_by_hami((d.type for d in devices), "Metax-SGPU")  # HAMi v2.10's getNodeResources


def test_link_zones_are_metaxlink_groups(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(6, links=[3, 3, 0, 7, 7, 7])  # the driver's groups, renumbered from 1
    assert [e.get("linkZone", 0) for e in sgpu_entries(metax_node(gpus))] == [1, 1, 0, 2, 2, 2]


def test_numa_comes_from_sysfs(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(8)
    assert [e.get("numa", 0) for e in sgpu_entries(metax_node(gpus))] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_unavailable_card_is_unhealthy(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(2)
    gpus[1] = replace(gpus[1], healthy=False)
    entries = sgpu_entries(metax_node(gpus))
    assert [e.get("healthy", False) for e in entries] == [True, False]


def test_whole_card_node_publishes_cards_links_and_metax_topology(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(4, links=[1, 1, 1, 0])
    (inventory,) = found(metax_node(gpus), nodeKind="gpu")
    assert inventory.kind == "Metax-GPU"
    assert [(d.id, d.count, d.devmem, d.type) for d in inventory.devices] == [
        (g.uuid, 1, 65536, "MXC500") for g in gpus
    ]
    links = decode_link_scores(inventory.annotations[discovery.GPU_LINK_ANNOTATION])
    assert links[gpus[0].uuid] == {gpus[1].uuid: 10, gpus[2].uuid: 10}
    assert gpus[3].uuid not in links
    # per number of cards: the best set's links, and what the other free cards lose by it
    assert json.loads(inventory.annotations[discovery.SCORE_ANNOTATION]) == {"1": 0, "2": 10, "3": 30, "4": 30}
    assert json.loads(inventory.annotations[discovery.LOSS_ANNOTATION]) == {"1": 0, "2": 20, "3": 0, "4": 0}


def test_mx_smi_is_read_where_mxsml_is_absent(fakes: F, metax_node: MakeNode) -> None:
    node = metax_node(fakes.c500_server(3))
    by_library = sgpu_entries(node)
    by_tool = sgpu_entries(node, "mx-smi")
    strip = [{k: v for k, v in e.items() if k != "linkZone"} for e in by_library]
    assert by_tool == strip  # the same cards, without MetaXLink (mx-smi reports none)
    plugins = node.plugins("mx-smi")
    plugins.discover()
    assert runtime_for(plugins.vendors[0].settings).source == "mx-smi"


def test_malformed_mx_smi_line_names_tool_and_line_and_keeps_the_others(fakes: F) -> None:
    gpus = fakes.c500_server(3)
    listing = fakes.mx_smi_listing(gpus).replace(f"(UUID: {gpus[1].uuid})", "(UUID:", 1)
    report = mxsmi.parse(listing, fakes.mx_smi_table(gpus))
    assert [d.uuid for d in report.devices] == [gpus[0].uuid, gpus[2].uuid]
    (problem,) = report.problems
    assert problem.startswith("mx-smi -L line 4: cannot read 'GPU#1")


def test_malformed_memory_cell_names_the_table_line(fakes: F) -> None:
    gpus = fakes.c500_server(2)
    table = fakes.mx_smi_table(gpus).replace("0/65536 MiB", "lots", 1)
    report = mxsmi.parse(fakes.mx_smi_listing(gpus), table)
    assert [d.uuid for d in report.devices] == [gpus[1].uuid]
    assert any(p.startswith("mx-smi line ") and "cannot read the memory of GPU 0" in p for p in report.problems)


def test_malformed_mx_smi_keeps_the_node_serving(fakes: F, metax_node: MakeNode) -> None:
    node = metax_node(fakes.c500_server(2))
    listing = fakes.mx_smi_listing(node.gpus).replace("0000:11:00.0", "0000:11:00", 1)
    fakes.write_mx_smi(node.directory / "bin", listing, fakes.mx_smi_table(node.gpus))
    assert [e["uuid"] for e in sgpu_entries(node, "mx-smi")] == [node.gpus[0].uuid]


def test_failing_mx_smi_reports_no_devices(fakes: F, metax_node: MakeNode) -> None:
    node = metax_node(fakes.c500_server(1))
    fakes.write_mx_smi(node.directory / "bin", "", "", exit_code=3)
    assert found(node, "mx-smi") == []


def test_failing_mxsml_call_falls_back_to_mx_smi(
    fakes: F, metax_node: MakeNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = metax_node(fakes.c500_server(2))
    monkeypatch.setenv("FAKE_MXSML_FAIL", "mxSmlGetMemoryInfo")
    plugins = node.plugins()
    (inventory,) = plugins.discover()["metax"]
    assert [d.id for d in inventory.devices] == [g.uuid for g in node.gpus]
    assert runtime_for(plugins.vendors[0].settings).source == "mx-smi"


def test_no_driver_no_devices(fakes: F, metax_node: MakeNode) -> None:
    node = metax_node(fakes.c500_server(1))
    (node.directory / "bin" / "mx-smi").unlink()
    assert found(node, "mx-smi") == []


def test_card_without_vram_is_not_registered(fakes: F, metax_node: MakeNode) -> None:
    gpus = fakes.c500_server(2)
    gpus[0] = replace(gpus[0], total=0)
    assert [e["uuid"] for e in sgpu_entries(metax_node(gpus))] == [gpus[1].uuid]


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "{}",
        "[1, 2]",
        '[{"uuid": 5}]',
        '[{"uuid": "a,b", "totalVRam": 1}]',
        '[{"uuid": "x", "totalVRam": -1}]',
    ],
)
def test_malformed_node_annotation_gives_no_device(raw: str) -> None:
    assert discovery.read_sgpu_devices({discovery.SGPU_ANNOTATION: raw}) == []


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "uuid",
                        "totalVRam",
                        "totalDevCount",
                        "totalCompute",
                        "numa",
                        "healthy",
                        "qosPolicy",
                        "linkZone",
                        "model",
                    ]
                ),
                inner,
                max_size=6,
            )
        ),
        max_leaves=12,
    )
)
def test_node_annotation_reader_never_crashes(value: object) -> None:
    for device in discovery.read_sgpu_devices({discovery.SGPU_ANNOTATION: json.dumps(value)}):
        assert device.devmem >= 0


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.sampled_from(list("GPU#0123 :.()|/MiBabcdefUID-Available\n")), max_size=300),
    st.text(alphabet=st.sampled_from(list("| 0123:./MiBaC\n")), max_size=300),
)
def test_mx_smi_parser_never_crashes(listing: str, table: str) -> None:
    try:
        report = mxsmi.parse(listing, table)
    except mxsmi.MxSmiError:
        return
    for d in report.devices:
        assert d.memory_total >= 0
