"""Discovery against the fake DCMI and the fake npu-smi: the register annotation HAMi's Ascend device plugin writes
for the same machine, the older DCMI names, npu-smi's documented table formats as the fallback, health, soft split,
unknown chips, and nodes without any Ascend driver."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from hami.codec import decode_node_register, encode_node_register
from hami.model import NodeInventory
from hami.testing.hami_rules import counted_by_hami
from hami_vendor_ascend.npusmi import NpuSmiError, parse_info

NodeFactory = Callable[..., Any]


def discover(node: Any, source: str = "dcmi", **settings: Any) -> list[NodeInventory]:
    return node.plugins(source, **settings).discover().get("ascend", [])


def only(node: Any, source: str = "dcmi", **settings: Any) -> NodeInventory:
    (inventory,) = discover(node, source, **settings)
    return inventory


# --------------------------------------------------------------------------------------------------------
# The register annotation
# --------------------------------------------------------------------------------------------------------


def hami_register(npus: list[Any], kind: str, count: int, devmem: int, devcore: int, networks: bool = True) -> Any:
    """The devices exactly as HAMi v2.10's Ascend device plugin registers them (register.go): index = position,
    Count = vDeviceCount, Devmem = memoryAllocatable, Devcore = aiCore, Type = common word, Numa 0, and for
    910-series custominfo.NetworkID = 1 from the fifth NPU on (0 for every 910C die)."""
    out = []
    for i, n in enumerate(npus):
        device: dict[str, Any] = {"id": n.uuid, "index": i, "count": count, "devmem": devmem, "devcore": devcore,
                                  "type": kind, "numa": 0, "health": n.health == 0}  # fmt: skip
        if networks:
            device["custominfo"] = {"NetworkID": 0 if kind == "Ascend910C" else int(i > 3)}
        out.append(device)
    return out


def as_written(inventory: NodeInventory) -> Any:
    """What the node daemon writes (core's codec), read back as JSON objects."""
    objects = json.loads(encode_node_register(inventory.devices))
    for obj in objects:
        obj.setdefault("health", False)  # Go omits false
    return objects


def test_an_eight_npu_910b3_server_registers_as_hami_writes_it(ascend_node: NodeFactory, machines: Any) -> None:
    npus = machines.b3_server()
    found = only(ascend_node(npus))
    assert found.kind == "Ascend910B3"
    assert as_written(found) == hami_register(npus, "Ascend910B3", count=4, devmem=65536, devcore=20)
    assert found.annotations == {"hami-vnpu-core": "false"}
    # HAMi's scheduler reads it back unchanged (the register round-trips through the codec)
    assert decode_node_register(encode_node_register(found.devices)) == list(found.devices)
    assert counted_by_hami((d.type for d in decode_node_register(encode_node_register(found.devices))), found.kind)
    assert npus[0].uuid == "3B0A0000-00000011-00000022-00000033-00000044"  # die id words, %08X, joined by -


def test_910c_dies_register_on_one_network(ascend_node: NodeFactory, machines: Any) -> None:
    npus = machines.c_superpod(4)
    found = only(ascend_node(npus))
    assert found.kind == "Ascend910C"
    assert as_written(found) == hami_register(npus, "Ascend910C", count=4, devmem=65536, devcore=20)


def test_310p_cards_register_their_ddr_chips_without_network_ids(ascend_node: NodeFactory, machines: Any) -> None:
    npus = machines.p310_cards()
    found = only(ascend_node(npus))
    assert found.kind == "Ascend310P"
    assert as_written(found) == hami_register(npus, "Ascend310P", count=7, devmem=21527, devcore=8, networks=False)


def test_soft_split_nodes_register_percent_cores_and_say_so(ascend_node: NodeFactory, machines: Any) -> None:
    found = only(ascend_node(machines.b3_server(2)), hamiVnpuCore=True, deviceCoreScaling=1.5)
    assert [d.devcore for d in found.devices] == [150, 150]
    assert found.annotations == {"hami-vnpu-core": "true"}


def test_the_older_dcmi_names_give_the_same_register(ascend_node: NodeFactory, machines: Any) -> None:
    node = ascend_node(machines.b3_server(4))
    assert only(node, "old-dcmi").devices == only(node, "dcmi").devices


def test_a_chip_that_turns_unhealthy_is_reported_so_at_the_next_round(ascend_node: NodeFactory, machines: Any) -> None:
    node = ascend_node(machines.b3_server(4))
    plugins = node.plugins()
    (before,) = plugins.discover()["ascend"]
    assert all(d.health for d in before.devices)
    node.set_health(2, 3)  # a critical alarm
    (after,) = plugins.discover()["ascend"]
    assert [d.health for d in after.devices] == [True, True, False, True]


def test_a_configured_chip_name_decides_the_kind(ascend_node: NodeFactory, machines: Any) -> None:
    chip = {"chipName": "910B3", "memoryAllocatable": 61440, "memoryCapacity": 65536, "aiCore": 24}
    found = only(ascend_node(machines.b3_server(1)), chips={"Ascend910B4-1": chip})
    assert found.kind == "Ascend910B4-1"  # the configured entry that names the driver's chip wins
    assert (found.devices[0].devmem, found.devices[0].devcore, found.devices[0].count) == (61440, 24, 1)


def test_chips_no_configured_entry_names_are_left_out_with_the_names_to_configure(
    ascend_node: NodeFactory, machines: Any, caplog: pytest.LogCaptureFixture
) -> None:
    npus = [n.__class__(**{**n.__dict__, "name": "910B9"}) for n in machines.b3_server(2)]
    with caplog.at_level(logging.ERROR, "hami_vendor_ascend"):
        assert discover(ascend_node(npus)) == []
    assert "named 910B9 match no configured chip" in caplog.text
    assert "910B3 (Ascend910B3)" in caplog.text


# --------------------------------------------------------------------------------------------------------
# npu-smi: the fallback, and its documented formats
# --------------------------------------------------------------------------------------------------------

DOCUMENTED_910B = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.0                   Version: 24.1.0                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 70.0        34                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           1197 / 13553      1365 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Warning       | 71.2        36                0    / 0             |
| 0                         | 0000:01:00.0  | 0           1198 / 13553      1366 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""

DOCUMENTED_310P = """\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                   Version: 23.0.0                                                       |
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Name                  | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+===============================+=================+======================================================+
| 6       310P3                 | OK              | NA           50                0     / 0             |
| 0       0                     | 0000:84:00.0    | 0            1839 / 21525                            |
+===============================+=================+======================================================+
| 6       310P3                 | OK              | NA           48                0     / 0             |
| 1       1                     | 0000:84:00.0    | 0            1840 / 21525                            |
+===============================+=================+======================================================+
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Chip                  | Process id      | Process name             | Process memory(MB)        |
+===============================+=================+======================================================+
| No running processes found in NPU 6                                                                    |
+===============================+=================+======================================================+
"""


def test_the_documented_910b_table_is_read() -> None:
    chips = parse_info(DOCUMENTED_910B)
    assert [(c.card_id, c.device_id, c.phy_id, c.chip_name, c.health, c.memory_mib, c.uuid) for c in chips] == [
        (0, 0, 0, "910B3", 0, 65536, "NPU-0000-C1-00.0"),
        (1, 0, 1, "910B3", 1, 65536, "NPU-0000-01-00.0"),  # only OK is healthy
    ]


def test_the_documented_310p_table_is_read_with_its_device_ids_and_ddr_memory() -> None:
    chips = parse_info(DOCUMENTED_310P)
    assert [(c.card_id, c.device_id, c.phy_id, c.memory_mib) for c in chips] == [(6, 0, 0, 21525), (6, 1, 1, 21525)]


@pytest.mark.parametrize("text", ["", "npu-smi: command failed\n", "| something | else |\n"])
def test_output_without_a_chip_table_is_an_error(text: str) -> None:
    with pytest.raises(NpuSmiError, match="no chip table"):
        parse_info(text)


def test_without_dcmi_the_chips_come_from_npu_smi(
    ascend_node: NodeFactory, machines: Any, caplog: pytest.LogCaptureFixture
) -> None:
    npus = machines.b3_server(8)
    with caplog.at_level(logging.WARNING, "hami_vendor_ascend"):
        found = only(ascend_node(npus), "npu-smi")
    assert "read from `npu-smi info` instead" in caplog.text
    assert [d.id for d in found.devices] == [f"NPU-{n.bus.replace(':', '-')}" for n in npus]
    assert [d.custom for d in found.devices] == [{"NetworkID": int(i > 3)} for i in range(8)]
    assert {(d.devmem, d.devcore, d.count, d.type) for d in found.devices} == {(65536, 20, 4, "Ascend910B3")}


def test_a_dcmi_that_fails_falls_back_to_npu_smi(
    ascend_node: NodeFactory, machines: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DCMI_FAIL", "dcmi_get_device_chip_info")
    found = only(ascend_node(machines.p310_cards()))
    assert [d.id for d in found.devices] == ["NPU-0000-84-00.0", "NPU-0000-85-00.0"]


def test_a_node_without_any_ascend_driver_reports_nothing_and_says_so_once(
    ascend_node: NodeFactory, machines: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    node = ascend_node(machines.b3_server(2))
    monkeypatch.setenv("FAKE_DCMI_INIT_FAIL", "1")
    plugins = node.plugins(npuSmi=str(node.directory / "no-such-npu-smi"))
    with caplog.at_level(logging.WARNING, "hami_vendor_ascend"):
        assert plugins.discover().get("ascend", []) == []
        assert plugins.discover().get("ascend", []) == []
    said = [r.getMessage() for r in caplog.records if "reports no Ascend devices" in r.getMessage()]
    assert len(said) == 1, said
    assert "dcmi_init failed" in said[0]
    assert "no-such-npu-smi is not installed" in said[0]
