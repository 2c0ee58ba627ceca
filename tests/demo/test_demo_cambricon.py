"""`hami demo` with a Cambricon node (`examples/demo-inventory-cambricon.yaml`, `examples/pods-cambricon/`).

Run as a user runs it, as its own process: the node daemon publishes the MLUs (its per-card register, so the
demo does not wait on a capacity the fake kubelet never reports), the scheduler writes the dynamic-sMLU profile,
and Allocate answers with Cambricon's container edits on simulated cards.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("demo-cambricon")
    inventory = str(ROOT / "examples" / "demo-inventory-cambricon.yaml")
    args = ["demo", "--json", "--workdir", str(workdir), "--inventory", inventory]
    done = subprocess.run(
        [sys.executable, "-m", "hami.cli", *args, "--examples", str(ROOT / "examples" / "pods-cambricon")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {f"{p['namespace']}/{p['name']}": p for p in result["pods"]} | {"summary": result["summary"]}


def test_a_share_of_two_cards_is_refused_with_the_profile_rule(report: dict[str, Any]) -> None:
    pod = report["default/cambricon-share-of-two"]
    assert (pod["outcome"], pod["step"]) == ("unschedulable", "filter")
    assert "a dynamic-sMLU share covers one card" in pod["failed_nodes"]["mlu-node"]


def test_a_share_runs_with_its_profile_and_cambricons_env(report: dict[str, Any]) -> None:
    pod = report["default/cambricon-dsmlu-share"]
    assert pod["outcome"] == "running", pod
    ((device),) = pod["devices"]
    assert (device["memory"], device["cores"]) == (4096, 25)
    index = int(device["uuid"].rsplit("-", 1)[1])
    assert pod["annotations"]["CAMBRICON_DSMLU_PROFILE"] == f"{index}_25_16"
    assert pod["annotations"]["CAMBRICON_DSMLU_ASSIGNED"] == pod["annotations"]["CAMBRICON_DSMLU_ASSIGHED"] == "true"
    assert pod["env"]["infer"] == {"CAMBRICON_VISIBLE_DEVICES": str(index)}


def test_whole_cards_run_together(report: dict[str, Any]) -> None:
    pod = report["default/cambricon-whole-cards"]
    assert pod["outcome"] == "running", pod
    indices = [int(d["uuid"].rsplit("-", 1)[1]) for d in pod["devices"]]  # in the order granted (HAMi's walk)
    assert len(set(indices)) == 2
    assert all(d["memory"] == 24576 and d["cores"] == 100 for d in pod["devices"])
    assert pod["env"]["trainer"] == {"CAMBRICON_VISIBLE_DEVICES": ",".join(map(str, indices))}
    assert report["summary"].startswith("3 pods: 2 running, 1 unschedulable")
