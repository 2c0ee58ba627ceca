"""Simulated DCUs (`hami node --simulated-inventory`, `hami demo`): the inventory's ``driver`` facts (PCI address,
DRM nodes) reach Allocate and the container edits through `hami_simulated_devices`, where ROCm SMI's and sysfs's do
on a node, and no driver is asked.

The host is given a ROCm SMI, a DMI and an hy-smi that do not exist and an empty sysfs: any read of the driver
would find no DCU and Allocate would refuse the placement ("not on this node").
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from hami.errors import HamiError
from hami.model import Container, ContainerDevice, Pod
from hami.node import simulated
from hami.plugins import VendorPlugins
from hami_vendor_hygon import plugin

POD = Pod(name="p", namespace="ns", uid="uid-1", containers=(Container(name="main"),))
FACTS = [
    {"bdf": "0000:31:00.0", "drmCard": "card0", "drmRender": "renderD128"},
    {"bdf": "0000:34:00.0", "drmCard": "card1", "drmRender": "renderD129"},
]


def plugins(tmp_path: Path, **extra: Any) -> VendorPlugins:
    (tmp_path / "sys").mkdir(exist_ok=True)
    config = {
        "rocmSmiLibrary": str(tmp_path / "no-librocm_smi64.so"),
        "dmiLibrary": str(tmp_path / "no-libhydmi.so"),
        "hySmi": str(tmp_path / "no-hy-smi"),
        "sysfsRoot": str(tmp_path / "sys"),
        "vdevDir": str(tmp_path / "vdev"),
        "exporterDir": str(tmp_path / "exporter"),
        "hookPath": str(tmp_path / "hook"),
        **extra,
    }
    return VendorPlugins.from_plugins({"hygon": plugin}, config={"hygon": config})


def inventory(tmp_path: Path, driver: Any) -> Path:
    entry = {"kind": "DCU", "type": "Z100L", "id": "DCU-SIM", "repeat": 2, "devmem": 65536, "count": 4,
             "driver": driver}  # fmt: skip
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "devices": [entry]}]}))
    return path


def share(uuid: str, memory: int = 16384, cores: int = 50) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=uuid, type="Z100L", usedmem=memory, usedcores=cores),)


def test_a_vdcu_is_cut_on_the_inventorys_pci_address_and_the_container_gets_its_drm_nodes(tmp_path: Path) -> None:
    h = plugins(tmp_path)
    simulated.discover(inventory(tmp_path, FACTS), "n", h)
    h.allocate("DCU", POD, 0, share("DCU-SIM-1"))
    edits = h.container_edits("DCU", POD, 0, share("DCU-SIM-1"))
    assert [d.container_path for d in edits.devices] == [
        "/dev/kfd", "/dev/mkfd", "/dev/dri/card1", "/dev/dri/renderD129"
    ]  # fmt: skip
    (conf,) = (tmp_path / "exporter").glob("vdev*.conf")
    lines = conf.read_text().splitlines()
    assert "PciBusId: 0000:34:00.0" in lines
    assert "cu_count: 30" in lines  # half of a Z100L's 60 compute units, from the model table


def test_hami_core_mode_edits_name_the_simulated_dcus_drm_nodes(tmp_path: Path) -> None:
    h = plugins(tmp_path, dcuMode="hami-core")
    simulated.discover(inventory(tmp_path, FACTS), "n", h)
    h.allocate("DCU", POD, 0, share("DCU-SIM-0"))
    edits = h.container_edits("DCU", POD, 0, share("DCU-SIM-0"))
    assert "/dev/dri/renderD128" in [d.container_path for d in edits.devices]
    assert edits.env["HIP_DEVICE_UUIDS"] == "DCU-SIM-0"


def test_a_dcu_without_its_drm_nodes_is_logged_by_name_and_refused_at_allocate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = plugins(tmp_path)
    with caplog.at_level(logging.ERROR):
        simulated.discover(inventory(tmp_path, {"bdf": "0000:31:00.0", "drmCard": "card0"}), "n", h)
    assert "device DCU-SIM-0 has no driver.drmRender (a string) in the simulated inventory: add it" in caplog.text
    with pytest.raises(HamiError, match="DCU-SIM-0 is not on this node"):
        h.allocate("DCU", POD, 0, share("DCU-SIM-0"))


def test_an_id_that_is_not_dcu_serial_is_refused() -> None:
    devices = simulated.DeviceEntry(kind="DCU", id="GPU-1", devmem=1).devices()
    with pytest.raises(HamiError, match="device GPU-1: a DCU's id is DCU-<serial>"):
        VendorPlugins.from_plugins({"hygon": plugin}).simulated_devices("DCU", devices, {"GPU-1": FACTS[0]})
