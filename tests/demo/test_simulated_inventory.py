"""Simulated devices (`hami.node.simulated`): the inventory file's format, its errors, and the node daemon
reading its devices from it instead of from the vendors' discovery."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import scripted_vendor
import yaml
from node_harness import NODE, DaemonThread, eventually, node_annotations, scripted_devices, write_script

from hami.cluster import MemoryCluster
from hami.codec import decode_node_register
from hami.errors import ConfigError, HamiError
from hami.node import simulated
from hami.node.cli import node_settings
from hami.node.daemon import NodeSettings
from hami.plugins import VendorPlugins
from hami.testing.kubelet import FakeKubelet

ROOT = Path(__file__).resolve().parents[2]
REGISTER = "hami.io/node-scripted-register"


def write(path: Path, data: Any) -> Path:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data))
    tmp.replace(path)
    return path


def inventory(*devices: dict[str, Any], node: str = NODE, **extra: Any) -> dict[str, Any]:
    return {"nodes": [{"name": node, "devices": list(devices), **extra}]}


@pytest.fixture
def plugins(tmp_path: Path) -> VendorPlugins:
    # The scripted vendor's own discovery would report SCR-* devices: the inventory's SIM-* prove it is not asked.
    script = write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2)})
    return VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})


# --------------------------------------------------------------------------------------------------------
# The file
# --------------------------------------------------------------------------------------------------------


def test_repeat_expands_into_devices_named_by_index_with_per_device_numa(tmp_path: Path) -> None:
    path = write(
        tmp_path / "inv.yaml",
        inventory({"kind": "Scripted", "id": "SIM", "repeat": 3, "index": 4, "devmem": 1000, "numa": [0, 0, 1]}),
    )
    (node,) = simulated.load_inventory(path).nodes
    devices = node.inventories()["Scripted"].devices
    assert [(d.id, d.index, d.numa, d.count, d.devcore, d.health) for d in devices] == [
        ("SIM-4", 4, 0, 10, 100, True),
        ("SIM-5", 5, 0, 10, 100, True),
        ("SIM-6", 6, 1, 10, 100, True),
    ]


def test_the_demo_inventory_is_valid_and_publishes_hamis_link_scores_as_json(tmp_path: Path) -> None:
    loaded = simulated.load_inventory(ROOT / "examples" / "demo-inventory.yaml")
    assert [n.name for n in loaded.nodes] == [
        "gpu-node",
        "mixed-node",
        "ascend-node",
        "dcu-node",
        "iluvatar-node",
        "mt-node",
        "metax-node",
        "mlu-node",
        "enflame-node",
        "biren-node",
        "amd-node",
        "xpu-node",
        "va-node",
    ]
    gpu = loaded.node("gpu-node")
    scores = json.loads(gpu.published_annotations()["hami.io/node-nvidia-score"])
    assert (scores[0]["uuid"], scores[0]["score"]["GPU-a100-3"]) == ("GPU-a100-0", 200)
    assert sum(e.repeat for e in gpu.devices) == 8


def test_readings_are_what_the_node_monitor_exports_for_simulated_devices(tmp_path: Path) -> None:
    path = write(
        tmp_path / "inv.yaml",
        inventory(
            {"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 1000,
             "reading": [{"memoryUsedMiB": 10, "utilization": 40, "power": 99.5, "temperature": 50},
                         {"utilization": 7}]},
            {"kind": "Scripted", "id": "OTHER", "devmem": 1000},
        ),
    )  # fmt: skip
    found = simulated.readings(path, NODE)
    assert [(r.device_uuid, r.memory_used_bytes, r.utilization_percent, r.power_watts, r.temperature_celsius)
            for r in found] == [("SIM-0", 10 * 2**20, 40, 99.5, 50), ("SIM-1", None, 7, None, None)]  # fmt: skip
    assert simulated.readings(tmp_path / "missing.yaml", NODE) == []


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        ([{"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 1, "numa": [0]}], "numa lists 1 nodes for 2"),
        ([{"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 1, "driver": [{}]}], "driver lists 1 entries for 2"),
        (
            [{"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 1, "reading": [{}]}],
            "reading lists 1 entries for 2",
        ),
        ([{"kind": "Scripted", "id": "SIM", "devmem": 1, "reading": {"fan": 3}}], "nodes[node-a].devices[0].reading"),
        ([{"kind": "Scripted", "id": "SIM", "devmem": 1, "colour": "red"}], "nodes[node-a].devices[0].colour"),
        ([{"kind": "Scripted", "id": "SIM"}], "nodes[node-a].devices[0].devmem: required, and missing"),
        ([{"kind": "Scripted", "id": "A,B", "devmem": 1}], "separators"),
        (
            [{"kind": "Scripted", "id": "SIM", "devmem": 1}, {"kind": "Scripted", "id": "SIM", "devmem": 2}],
            "device id SIM appears twice on node node-a",
        ),
    ],
)
def test_a_bad_file_is_reported_with_the_node_the_entry_and_the_field(
    tmp_path: Path, devices: list[dict[str, Any]], message: str
) -> None:
    path = write(tmp_path / "inv.yaml", inventory(*devices))
    with pytest.raises(ConfigError) as error:
        simulated.load_inventory(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)


def test_unreadable_and_non_yaml_files_say_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the simulated inventory .*missing\.yaml"):
        simulated.load_inventory(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("nodes: [unclosed")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        simulated.load_inventory(tmp_path / "bad.yaml")


def test_a_node_the_file_does_not_list_is_named_with_those_it_lists(tmp_path: Path, plugins: VendorPlugins) -> None:
    path = write(tmp_path / "inv.yaml", inventory({"kind": "Scripted", "id": "SIM", "devmem": 1}, node="elsewhere"))
    with pytest.raises(ConfigError, match=r"lists no node 'node-a' \(it lists elsewhere\)"):
        simulated.discover(path, NODE, plugins)


def test_discovery_groups_kinds_by_vendor_and_skips_kinds_nobody_serves(
    tmp_path: Path, plugins: VendorPlugins, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(
        tmp_path / "inv.yaml",
        inventory(
            {"kind": "Unknown", "id": "UNK", "devmem": 1},
            {"kind": "Scripted", "id": "SIM", "devmem": 1},
            {"kind": "ScriptedLegacy", "id": "LEG", "devmem": 2},
            annotations={"example.com/topology": {"a": 1}, "example.com/plain": "text"},
        ),
    )
    found = simulated.discover(path, NODE, plugins)
    assert list(found) == ["scripted"]
    assert [(i.kind, [d.id for d in i.devices]) for i in found["scripted"]] == [
        ("Scripted", ["SIM"]),
        ("ScriptedLegacy", ["LEG"]),
    ]
    # the node's annotations go with the first kind served (the unknown one listed before it is skipped)
    assert found["scripted"][0].annotations == {"example.com/topology": '{"a":1}', "example.com/plain": "text"}
    assert found["scripted"][1].annotations == {}
    assert "lists Unknown devices on node node-a, but no loaded vendor serves that kind" in caplog.text


def test_each_vendor_is_handed_its_devices_and_their_driver_facts_which_are_not_published(
    tmp_path: Path, plugins: VendorPlugins, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        tmp_path / "inv.yaml",
        inventory(
            {"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 1, "driver": [{"slot": 7}, {"slot": 8}]},
            {"kind": "ScriptedLegacy", "id": "LEG", "devmem": 2, "driver": {"slot": 9}},
            {"kind": "Scripted", "id": "BARE", "devmem": 3},
        ),
    )
    handed: list[tuple[str, list[str], dict[str, Any]]] = []

    def record(kind: str, devices: Any, driver: Any) -> None:
        handed.append((kind, [d.id for d in devices], dict(driver)))

    monkeypatch.setattr(plugins, "simulated_devices", record)
    found = simulated.discover(path, NODE, plugins)
    assert handed == [
        ("Scripted", ["SIM-0", "SIM-1", "BARE"], {"SIM-0": {"slot": 7}, "SIM-1": {"slot": 8}, "BARE": {}}),
        ("ScriptedLegacy", ["LEG"], {"LEG": {"slot": 9}}),
    ]
    assert all(not d.custom for i in found["scripted"] for d in i.devices)  # facts are the vendor's, not the register's


def test_a_vendor_refusing_its_driver_facts_is_logged_and_its_devices_still_served(
    tmp_path: Path, plugins: VendorPlugins, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write(tmp_path / "inv.yaml", inventory({"kind": "Scripted", "id": "SIM", "devmem": 1}))

    def refuse(kind: str, devices: Any, driver: Any) -> None:
        raise HamiError("device SIM has no driver.slot (an integer) in the simulated inventory: add it")

    monkeypatch.setattr(plugins, "simulated_devices", refuse)
    found = simulated.discover(path, NODE, plugins)
    assert [d.id for d in found["scripted"][0].devices] == ["SIM"]
    assert f"{path}, node node-a, the Scripted devices' driver facts: device SIM has no driver.slot" in caplog.text


def test_the_node_flag_and_the_config_key_set_the_inventory(tmp_path: Path) -> None:
    import argparse

    from hami.node.cli import add_node_parser

    parser = argparse.ArgumentParser(prog="hami")
    add_node_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["node", "--node-name", NODE, "--simulated-inventory", "inv.yaml"])
    assert node_settings(args).simulated_inventory == Path("inv.yaml")
    args = parser.parse_args(["node", "--node-name", NODE])
    assert node_settings(args, {"simulatedInventory": "/etc/hami/inv.yaml"}).simulated_inventory == Path(
        "/etc/hami/inv.yaml"
    )


# --------------------------------------------------------------------------------------------------------
# The daemon on simulated devices
# --------------------------------------------------------------------------------------------------------


@pytest.fixture
def daemon_world(
    tmp_path: Path, plugins: VendorPlugins
) -> Iterator[tuple[Path, MemoryCluster, FakeKubelet, DaemonThread]]:
    path = write(
        tmp_path / "inv.yaml",
        inventory({"kind": "Scripted", "id": "SIM", "repeat": 2, "devmem": 4096, "count": 2, "numa": [0, 1]}),
    )
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": NODE}})
    with FakeKubelet() as kubelet:
        settings = NodeSettings(
            node_name=NODE,
            device_plugin_dir=kubelet.directory,
            hook_dir=tmp_path / "hooks",
            metrics_listen="127.0.0.1:0",
            discovery_interval_seconds=0.05,
            register_interval_seconds=0.1,
            kubelet_poll_seconds=0.05,
            simulated_inventory=path,
        )
        daemon = DaemonThread(settings, plugins, cluster).start()
        try:
            yield path, cluster, kubelet, daemon
        finally:
            daemon.stop()


def test_the_daemon_publishes_and_serves_the_inventory_not_the_vendors_discovery(
    daemon_world: tuple[Path, MemoryCluster, FakeKubelet, DaemonThread],
) -> None:
    _, cluster, kubelet, _ = daemon_world
    published = eventually(lambda: node_annotations(cluster, NODE).get(REGISTER), what="register annotation")
    assert [(d.id, d.count, d.devmem, d.numa) for d in decode_node_register(published)] == [
        ("SIM-0", 2, 4096, 0),
        ("SIM-1", 2, 4096, 1),
    ]
    devices = kubelet.wait_for_devices("scripted.example/accel", lambda ds: len(ds) == 4)
    assert [d.id for d in devices] == ["SIM-0-0", "SIM-0-1", "SIM-1-0", "SIM-1-1"]


def test_editing_the_file_changes_the_devices_and_a_broken_edit_keeps_the_last_good_ones(
    daemon_world: tuple[Path, MemoryCluster, FakeKubelet, DaemonThread],
) -> None:
    path, cluster, kubelet, daemon = daemon_world
    kubelet.wait_for_devices("scripted.example/accel", lambda ds: len(ds) == 4)
    write(
        path,
        inventory(
            {"kind": "Scripted", "id": "SIM-0", "devmem": 4096, "count": 2},
            {"kind": "Scripted", "id": "SIM-1", "index": 1, "devmem": 4096, "count": 2, "health": False},
        ),
    )
    devices = kubelet.wait_for_devices("scripted.example/accel", lambda ds: not all(d.healthy for d in ds))
    assert {d.id for d in devices if not d.healthy} == {"SIM-1-0", "SIM-1-1"}
    eventually(lambda: '"health"' not in node_annotations(cluster, NODE)[REGISTER].split("SIM-1")[1])
    path.write_text("nodes: [unclosed")
    rounds = daemon.daemon.discoveries
    eventually(lambda: daemon.daemon.discoveries >= rounds + 3, what="three discovery rounds on the broken file")
    devices = kubelet.devices("scripted.example/accel") or []
    assert len(devices) == 4  # nothing vanished with the broken file
    assert {d.id for d in devices if not d.healthy} == {"SIM-1-0", "SIM-1-1"}
    assert len(decode_node_register(node_annotations(cluster, NODE)[REGISTER])) == 2
