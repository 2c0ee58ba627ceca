"""One accounting, the scheduler's side: the devices kube-scheduler allocated to ResourceClaims of HAMi's DRA
driver count on their node, so the extender does not give a device-plugin pod what a claim holds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from scheduler_harness import Harness, gpu_node, gpu_pod

from hami.scheduler.extender import ExtenderSettings

DRIVER = "hami.io"


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness(ExtenderSettings(bind_lock_wait_seconds=0.5, dra_driver=DRIVER))
    try:
        yield h
    finally:
        h.stop()


def _claim(name: str, node: str, results: list[dict[str, Any]], driver: str = DRIVER) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": driver, "pool": node, **r} for r in results
        ]}}},
    }  # fmt: skip


def _share(device: str, memory: str, cores: str) -> dict[str, Any]:
    return {"device": device, "shareID": "s", "consumedCapacity": {
        f"{DRIVER}/memory": memory, f"{DRIVER}/cores": cores, f"{DRIVER}/shares": "1"}}  # fmt: skip


def _fits(harness: Harness, name: str, mem: int, cores: int | None = None) -> bool:
    harness.add_pod(gpu_pod(name, mem=mem, cores=cores))
    harness.flush()
    return bool(harness.filter(name)["NodeNames"])


def test_a_claims_share_is_not_given_to_a_pod_and_comes_back_when_the_claim_goes(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1, memory=16384))
    harness.start()
    harness.cluster.create("resourceclaims", _claim("big", "n1", [_share("nvidia-0", "12Gi", "50")]))
    harness.flush()
    assert harness.service is not None
    assert harness.service.state.usage_snapshot()["n1"]["NVIDIA"]["GPU-n1-0"] == (1, 12288, 50)
    assert not _fits(harness, "too-big", 6000)
    assert _fits(harness, "fits", 4000)
    assert not _fits(harness, "too-many-cores", 100, cores=60)
    harness.cluster.delete("resourceclaims", "big", "team")
    harness.flush()
    assert _fits(harness, "after", 6000)


def test_a_whole_device_claim_leaves_nothing_and_other_drivers_do_not_count(harness: Harness) -> None:
    harness.add_node(gpu_node("n1", gpus=1, memory=16384))
    harness.cluster.create("resourceclaims", _claim("other", "n1", [{"device": "nvidia-0"}], driver="gpu.example"))
    harness.start()
    assert _fits(harness, "first", 1000)
    harness.cluster.create("resourceclaims", _claim("whole", "n1", [{"device": "nvidia-0"}]))
    harness.flush()
    assert not _fits(harness, "second", 1000)


def test_a_claim_seen_before_its_node_counts_once_the_node_is_known(harness: Harness) -> None:
    harness.start()
    harness.cluster.create("resourceclaims", _claim("early", "n2", [_share("nvidia-1", "16Gi", "0")]))
    harness.flush()
    harness.add_node(gpu_node("n2", gpus=2, memory=16384))
    harness.flush()
    assert harness.service is not None
    usage = harness.service.state.usage_snapshot()["n2"]["NVIDIA"]
    assert usage["GPU-n2-1"] == (1, 16384, 0)
    assert usage["GPU-n2-0"] == (0, 0, 0)
