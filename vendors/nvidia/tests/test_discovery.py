"""Discovery against the fake NVML: the register annotation HAMi's device plugin would write, link scores, NUMA,
MIG profiles and instances, health, and nodes without NVML."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from ctypes.util import find_library
from pathlib import Path
from typing import Any

import pytest

from hami.codec import decode_link_scores, decode_node_register, encode_link_scores, encode_node_register
from hami.model import NodeInventory
from hami.testing.hami_rules import counted_by_hami

SCORE = "hami.io/node-nvidia-score"
INSTANCES = "hami.io/node-nvidia-mig-instances"
NodeFactory = Callable[..., Any]


def inventory(node: Any, **settings: Any) -> NodeInventory:
    (found,) = node.plugins(**settings).discover()["nvidia"]
    return found


def hami_entry(
    uuid: str,
    index: int,
    devmem: int,
    model: str,
    numa: int,
    *,
    count: int = 10,
    devcore: int = 100,
    mode: str = "hami-core",
    health: bool = True,
    profiles: str = "",
) -> str:
    """One device exactly as HAMi v2.10's device plugin marshals it (Go field order, zero values omitted)."""
    text = f'{{"id":"{uuid}","count":{count},"devmem":{devmem},"devcore":{devcore},"type":"{model}","numa":{numa}'
    text += ',"health":true' if health else ""
    text += f',"index":{index},"mode":"{mode}"'
    text += f',"migProfiles":{profiles}' if profiles else ""
    return text + "}"


# --------------------------------------------------------------------------------------------------------
# The register annotation
# --------------------------------------------------------------------------------------------------------


def test_h100_box_registers_as_hami_writes_it(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.h100()
    found = inventory(gpu_node(box))
    expected = (
        "["
        + ",".join(hami_entry(d["uuid"], i, 81559, "NVIDIA H100 PCIe", i // 4) for i, d in enumerate(box["devices"]))
        + "]"
    )
    assert encode_node_register(found.devices) == expected


def test_mixed_node_prefixes_models_and_applies_split_and_scaling(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.mixed()
    found = inventory(gpu_node(box), deviceSplitCount=4, deviceMemoryScaling=1.5, deviceCoreScaling=1.2)
    uuids = [d["uuid"] for d in box["devices"]]
    expected = (
        "["
        + ",".join(
            [
                hami_entry(uuids[0], 0, 23040, "NVIDIA-Tesla T4", 0, count=4, devcore=120),
                hami_entry(uuids[1], 1, 23040, "NVIDIA-Tesla T4", 0, count=4, devcore=120),
                hami_entry(uuids[2], 2, 49152, "NVIDIA-Tesla V100-SXM2-32GB", 1, count=4, devcore=120),
                hami_entry(uuids[3], 3, 49152, "NVIDIA-Tesla V100-SXM2-32GB", 1, count=4, devcore=120),
            ]
        )
        + "]"
    )
    assert encode_node_register(found.devices) == expected
    assert decode_node_register(expected) == list(found.devices)


A100_REGISTER_PROFILES = (
    '[{"name":"1g.5gb","memoryMB":4864,"core":14,"sliceCount":1,"placements":['
    + ",".join(f'{{"start":{i},"size":1}}' for i in range(7))
    + ']},{"name":"2g.10gb","memoryMB":9856,"core":28,"sliceCount":2,"placements":'
    '[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2}]},'
    '{"name":"3g.20gb","memoryMB":19968,"core":42,"sliceCount":3,"placements":[{"start":0,"size":4},{"start":4,"size":4}]},'
    '{"name":"4g.20gb","memoryMB":19968,"core":57,"sliceCount":4,"placements":[{"start":0,"size":4}]},'
    '{"name":"7g.40gb","memoryMB":40192,"core":100,"sliceCount":7,"placements":[{"start":0,"size":8}]},'
    '{"name":"1g.10gb","memoryMB":9856,"core":14,"sliceCount":1,"placements":'
    '[{"start":0,"size":2},{"start":2,"size":2},{"start":4,"size":2},{"start":6,"size":2}]}]'
)


def test_mig_gpus_register_unscaled_with_their_allowed_profiles_and_placements(
    gpu_node: NodeFactory, boxes: Any
) -> None:
    box = boxes.a100_mig()
    found = inventory(gpu_node(box), deviceMemoryScaling=2, deviceCoreScaling=2)  # scaling never applies to MIG
    expected = (
        "["
        + ",".join(
            hami_entry(d["uuid"], i, 40960, "NVIDIA A100-SXM4-40GB", 0, mode="mig", profiles=A100_REGISTER_PROFILES)
            for i, d in enumerate(box["devices"])
        )
        + "]"
    )
    assert encode_node_register(found.devices) == expected  # the +me variant is left out unless allow-listed


def test_mig_profile_allowlist_limits_what_a_model_publishes(gpu_node: NodeFactory, boxes: Any) -> None:
    allow = [{"models": ["A100-SXM4-40GB"], "profiles": ["1g.10gb", "3g.20gb", "1g.5gb+me"]}]
    found = inventory(gpu_node(boxes.a100_mig()), migProfileAllowlist=allow)
    names = [p["name"] for p in found.devices[0].mig_profiles]
    assert names == ["3g.20gb", "1g.5gb+me", "1g.10gb"]  # NVML's order
    other = inventory(gpu_node(boxes.a100_mig()), migProfileAllowlist=[{"models": ["H100"], "profiles": ["1g.10gb"]}])
    assert other.devices[0].mig_profiles == ()


def test_existing_mig_instances_are_published_for_the_scheduler(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.a100_mig()
    found = inventory(gpu_node(box))
    (instance,) = json.loads(found.annotations[INSTANCES])
    assert instance["gpuUUID"] == box["devices"][1]["uuid"]
    assert instance["profile"] == "1g.5gb"
    assert instance["placement"] == {"start": 6, "size": 1}
    assert instance["migUUID"].startswith("MIG-")
    assert (instance["gpuInstanceID"], instance["computeInstanceID"]) == (1, 0)


def test_a_node_without_mig_gpus_publishes_no_instance_annotation(gpu_node: NodeFactory, boxes: Any) -> None:
    assert INSTANCES not in inventory(gpu_node(boxes.mixed())).annotations


# --------------------------------------------------------------------------------------------------------
# Link scores
# --------------------------------------------------------------------------------------------------------


def h100_expected_scores(uuids: list[str]) -> dict[str, dict[str, int]]:
    """HAMi's rule on the H100 box: PCIe (one switch 50, same CPU 20, across CPUs 10) + 100 per NVLink."""
    bridge = {0: 12, 2: 6, 4: 12, 6: 4}
    out: dict[str, dict[str, int]] = {}
    for a, ua in enumerate(uuids):
        out[ua] = {}
        for b, ub in enumerate(uuids):
            if a == b:
                continue
            if a // 2 == b // 2:
                out[ua][ub] = 50 + 100 * bridge[a - a % 2]
            else:
                out[ua][ub] = 20 if a // 4 == b // 4 else 10
    return out


def test_link_scores_count_pcie_distance_and_nvlinks(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.h100()
    found = inventory(gpu_node(box))
    uuids = [d["uuid"] for d in box["devices"]]
    expected = h100_expected_scores(uuids)
    assert decode_link_scores(found.annotations[SCORE]) == expected
    assert found.annotations[SCORE] == encode_link_scores(expected)
    assert found.link_scores == expected


def test_gpus_behind_nvswitches_score_their_common_switch_links(gpu_node: NodeFactory) -> None:
    switched = [{"remote": "switch"}] * 18
    box = {
        "devices": [
            {"uuid": "GPU-sw0", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "bus_id": "00000000:18:00.0",
             "nvlinks": switched},
            {"uuid": "GPU-sw1", "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "bus_id": "00000000:2A:00.0",
             "nvlinks": switched[:16] + [{"state": 0}] * 2},
            {"uuid": "GPU-pcie", "name": "NVIDIA L4", "memory_mib": 23034, "bus_id": "00000000:3A:00.0"},
        ],
        "topology": [[0, 50, 50], [50, 0, 50], [50, 50, 0]],
    }  # fmt: skip
    scores = inventory(gpu_node(box)).link_scores
    assert scores["GPU-sw0"]["GPU-sw1"] == 10 + 1600  # the smaller number of switch links, 16
    assert scores["GPU-sw1"]["GPU-sw0"] == 1610
    assert scores["GPU-sw0"]["GPU-pcie"] == 10


def test_a_link_seen_from_one_end_only_scores_zero(gpu_node: NodeFactory) -> None:
    box = {
        "devices": [
            {"uuid": "GPU-x", "name": "NVIDIA A10", "memory_mib": 23028, "bus_id": "00000000:18:00.0",
             "nvlinks": [{"remote": "00000000:2A:00.0"}]},
            {"uuid": "GPU-y", "name": "NVIDIA A10", "memory_mib": 23028, "bus_id": "00000000:2A:00.0",
             "nvlinks": [{"state": 0}]},
        ],
        "topology": [[0, 20], [20, 0]],
    }  # fmt: skip
    scores = inventory(gpu_node(box)).link_scores
    assert scores == {"GPU-x": {"GPU-y": 0}, "GPU-y": {"GPU-x": 0}}  # HAMi: asymmetric P2P links score 0


def test_link_scores_can_be_switched_off(gpu_node: NodeFactory, boxes: Any) -> None:
    found = inventory(gpu_node(boxes.h100()), publishLinkScores=False)
    assert SCORE not in found.annotations
    assert not found.link_scores


# --------------------------------------------------------------------------------------------------------
# NUMA and health
# --------------------------------------------------------------------------------------------------------


def test_numa_node_comes_from_sysfs_and_is_zero_when_sysfs_has_none(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.mixed()
    for device in box["devices"][:2]:
        device.pop("numa")  # no sysfs file for the T4s
    node = gpu_node(box)
    minus = node.root / "sys" / "bus" / "pci" / "devices" / "0000:af:00.0" / "numa_node"
    minus.write_text("-1\n")
    assert [d.numa for d in inventory(node).devices] == [0, 0, 1, 0]


def test_critical_xid_makes_a_gpu_unhealthy_and_application_xids_do_not(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.mixed()
    box["devices"][0]["xids"] = [13]  # graphics engine exception: the application's fault
    box["devices"][2]["xids"] = [79]  # fallen off the bus
    node = gpu_node(box)
    plugins = node.plugins()
    (found,) = plugins.discover()["nvidia"]
    assert [d.health for d in found.devices] == [True, True, False, True]
    node.xid(3, 48)  # a double-bit ECC error arrives later
    (again,) = plugins.discover()["nvidia"]
    assert [d.health for d in again.devices] == [True, True, False, False]
    (still,) = plugins.discover()["nvidia"]
    assert [d.health for d in still.devices] == [True, True, False, False]  # stays unhealthy


def test_health_check_can_be_disabled(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.mixed()
    box["devices"][2]["xids"] = [79]
    assert all(d.health for d in inventory(gpu_node(box), healthCheck=False).devices)


def test_a_lost_gpu_is_reported_unhealthy_with_its_last_known_memory(gpu_node: NodeFactory, boxes: Any) -> None:
    box = boxes.mixed()
    node = gpu_node(box)
    plugins = node.plugins()
    plugins.discover()
    box["devices"][1]["lost"] = 1
    config = Path(os.environ["FAKE_NVML_CONFIG"])
    config.write_text(json.dumps(box))
    os.utime(config, ns=(1, 1))  # a new modification time: the fake reloads the machine
    runtime = plugins.vendor("nvidia").settings.runtime
    runtime.close()  # the driver restarted: the next round opens a new session
    (found,) = plugins.discover()["nvidia"]
    lost = found.devices[1]
    assert (lost.health, lost.devmem) == (False, 15360)


# --------------------------------------------------------------------------------------------------------
# No NVML
# --------------------------------------------------------------------------------------------------------


def test_a_node_whose_driver_is_not_loaded_reports_nothing_and_says_so_once(
    gpu_node: NodeFactory, caplog: pytest.LogCaptureFixture
) -> None:
    node = gpu_node({"init_error": 9, "devices": []})
    plugins = node.plugins()
    with caplog.at_level(logging.INFO, logger="hami_vendor_nvidia"):
        assert plugins.discover() == {"nvidia": []}
        assert plugins.discover() == {"nvidia": []}
    said = [r for r in caplog.records if "no NVML on this node" in r.getMessage()]
    assert len(said) == 1
    assert "Driver Not Loaded" in said[0].getMessage()


def test_a_missing_nvml_library_reports_nothing(
    gpu_node: NodeFactory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = gpu_node({"devices": []})
    plugins = node.plugins(nvmlLibrary=str(tmp_path / "nowhere" / "libnvidia-ml.so.1"))
    with caplog.at_level(logging.INFO, logger="hami_vendor_nvidia"):
        assert plugins.discover() == {"nvidia": []}
    assert "no NVML on this node" in caplog.text


_DISCOVER = textwrap.dedent(
    """
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    import hami_vendor_nvidia.plugin as plugin
    from hami.codec import encode_node_register
    from hami.plugins import VendorPlugins
    plugins = VendorPlugins.from_plugins({"nvidia": plugin}, config={"nvidia": json.loads(sys.argv[1])})
    for _ in range(2):
        found = plugins.discover()["nvidia"]
    print(encode_node_register(found[0].devices) if found else "none")
    """
)


def _discover_in_subprocess(env: dict[str, str], settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _DISCOVER, json.dumps(settings)], env=env, capture_output=True, text=True, timeout=60
    )


def test_pynvml_finds_the_library_through_the_dynamic_loader_path(
    gpu_node: NodeFactory, boxes: Any, fake_nvml_library: Path
) -> None:
    node = gpu_node(boxes.mixed())
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_nvml_library.parent)}
    done = _discover_in_subprocess(env, {"sysfsRoot": str(node.root / "sys")})  # no nvmlLibrary: the loader finds it
    assert done.returncode == 0, done.stderr
    types = [d.type for d in decode_node_register(done.stdout.strip())]
    assert types == ["NVIDIA-Tesla T4"] * 2 + ["NVIDIA-Tesla V100-SXM2-32GB"] * 2
    assert counted_by_hami(types, "NVIDIA")  # HAMi v2.10's getNodeResources: the type holds the common word


@pytest.mark.skipif(find_library("nvidia-ml") is not None, reason="this host has a real NVML")
def test_without_any_nvml_the_daemon_reports_nothing_and_says_so_once() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "FAKE_NVML_CONFIG")}
    done = _discover_in_subprocess(env, {})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"
    assert done.stderr.count("no NVML on this node") == 1
