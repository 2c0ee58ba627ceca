"""`hami demo --keep`, as a new user tries it: the dashboard the demo's scheduler serves shows vendors by name, the
reason the unplaceable pod was refused, the Cambricon node, and what the node daemons measure (the inventory's
`reading`s) beside the grants, with the driver's nonsense shown as unknown.

The demo runs as its own process (`python -m hami.cli demo --json --keep`); the test reads its report line, asks
the dashboard's pages over HTTP, and ends the process it started with SIGINT, as Ctrl-C does.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        html = answer.read().decode()
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html))).strip()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("demo-keep")
    process = subprocess.Popen(
        [sys.executable, "-m", "hami.cli", "demo", "--json", "--keep", "--workdir", str(workdir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"the demo printed nothing; its logs are in {workdir}/logs"
        yield json.loads(line)
    finally:
        os.kill(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def eventually(url: str, wanted: str, seconds: float = 30.0) -> str:
    """The page once it says `wanted` (the dashboard scrapes the node daemons every 2 s while they come up)."""
    deadline = time.monotonic() + seconds
    text = page(url)
    while wanted not in text and time.monotonic() < deadline:
        time.sleep(0.5)
        text = page(url)
    return text


def test_the_cluster_page_names_vendors_shows_cambricon_and_usage(demo: dict[str, Any]) -> None:
    text = eventually(demo["dashboard"], "Memory in use 43008")
    assert "Cambricon MLU MLU370-X8 4" in text
    assert "Huawei Ascend Ascend910B3 Ascend910B3" in text
    assert "NVIDIA NVIDIA NVIDIA-A100-SXM4-40GB 8" in text
    assert "Memory in use 43008 / 286720 MiB 15%" in text  # GPU-a100-7 reads nonsense: not counted
    assert "Devices by busy time GPU-a100-0 gpu-node 92%" in text


def test_the_refused_pod_says_why_not_waiting_for_the_scheduler(demo: dict[str, Any]) -> None:
    text = page(demo["dashboard"])
    assert "waiting for the scheduler" not in text
    assert "too-big 0/13 nodes are available: amd-node: no NVIDIA devices registered" in text
    pod = page(demo["dashboard"] + "pods/default/too-big")
    assert "Unschedulable. 0/13 nodes are available:" in pod
    assert "Warning FailedScheduling" in pod


def test_node_page_shows_measured_figures_and_unknown_for_nonsense(demo: dict[str, Any]) -> None:
    text = eventually(demo["dashboard"] + "nodes/gpu-node", "in use 30720 MiB")
    assert "in use 30720 MiB · busy 92% · 355 W · 71 °C" in text
    assert "in use unknown · busy 0% · 51 W · unknown" in text  # GPU-a100-7's driver answered nonsense
    # another node's daemon: its first scrape may come after gpu-node's
    device = eventually(demo["dashboard"] + "devices/MLU-a1b2c3d4-mlu370-0", "Busy 12%")
    assert "Memory in use unknown Busy 12% Power 75.0 W Temperature 45 °C" in device


def test_workloads_page_lists_every_placed_pod_with_its_grant(demo: dict[str, Any]) -> None:
    text = page(demo["dashboard"] + "workloads")
    assert "cambricon-mlu-share mlu-node MLU-a1b2c3d4-mlu370-" in text
    assert "nvidia-memory mixed-node GPU-t4-" in text
    assert "3000 MiB unknown" in text  # simulated containers run no process: their use is unknown, not 0
