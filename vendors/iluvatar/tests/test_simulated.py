"""Simulated CoreX GPUs (`hami node --simulated-inventory`, `hami demo`): the inventory's ``driver.minor`` names the
device nodes through `hami_simulated_devices`, where ixML's minor numbers do on a node, and ixML is not opened.

The host is given an ixML library that does not exist: any read of the driver would find no GPU and the edits
would refuse the placement ("not on this node").
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
from hami_vendor_iluvatar import plugin

POD = Pod(name="p", namespace="ns", uid="uid-1", containers=(Container(name="main"),))


def plugins(tmp_path: Path, **extra: Any) -> VendorPlugins:
    config = {"ixmlLibrary": str(tmp_path / "no-libixml.so"), "hookPath": str(tmp_path / "hook"), **extra}
    return VendorPlugins.from_plugins({"iluvatar": plugin}, config={"iluvatar": config})


def inventory(tmp_path: Path, driver: Any) -> Path:
    entry = {"kind": "BI-V150", "type": "BI-V150", "id": "GPU-sim", "repeat": 2, "devmem": 32768, "driver": driver}
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump({"nodes": [{"name": "n", "devices": [entry]}]}))
    return path


def share(uuid: str) -> tuple[ContainerDevice, ...]:
    return (ContainerDevice(uuid=uuid, type="BI-V150", usedmem=4096, usedcores=50),)


@pytest.mark.parametrize("mode", ["gpu-manager", "hami-core"])
def test_the_device_node_is_named_by_the_inventorys_minor_number(tmp_path: Path, mode: str) -> None:
    h = plugins(tmp_path, iluvatarMode=mode)
    simulated.discover(inventory(tmp_path, [{"minor": 2}, {"minor": 3, "busId": "0000:8b:00.0"}]), "n", h)
    h.allocate("BI-V150", POD, 0, share("GPU-sim-1"))
    edits = h.container_edits("BI-V150", POD, 0, share("GPU-sim-1"))
    assert [d.container_path for d in edits.devices] == ["/dev/iluvatar3", "/dev/itrctl"]
    assert edits.env["IX_VISIBLE_DEVICES"] == "GPU-sim-1"


def test_a_gpu_without_a_minor_number_is_logged_by_name_and_refused_at_allocate(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = plugins(tmp_path)
    with caplog.at_level(logging.ERROR):
        simulated.discover(inventory(tmp_path, {}), "n", h)
    assert "device GPU-sim-0 has no driver.minor (an integer) in the simulated inventory: add it" in caplog.text
    with pytest.raises(HamiError, match="GPU-sim-0 is not on this node"):
        h.container_edits("BI-V150", POD, 0, share("GPU-sim-0"))
