"""Fixtures of the node daemon's in-process tests: the scripted vendor, a fake kubelet, an in-memory cluster
with one node, and the daemon on its own event loop (started by the test when its stage is set)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import scripted_vendor
from lagging_cluster import LaggingCluster
from node_harness import NODE, DaemonThread, scripted_devices, write_script

from hami.cluster import MemoryCluster
from hami.node.daemon import NodeSettings
from hami.plugins import VendorPlugins
from hami.testing.kubelet import FakeKubelet


@pytest.fixture
def script(tmp_path: Path) -> Path:
    scripted_vendor.RELEASED.clear()
    scripted_vendor.CONCURRENCY.update(now=0, max=0)
    return write_script(tmp_path / "script.json", {"Scripted": scripted_devices(2)})


@pytest.fixture
def plugins(script: Path) -> VendorPlugins:
    return VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})


@pytest.fixture
def cluster() -> LaggingCluster:
    """The API as the daemon sees it; its watch cache is up to date unless a test holds an object back."""
    c = LaggingCluster()
    c.create("nodes", {"metadata": {"name": NODE}})
    return c


@pytest.fixture
def kubelet() -> Iterator[FakeKubelet]:
    with FakeKubelet() as k:
        yield k


@pytest.fixture
def settings(kubelet: FakeKubelet, tmp_path: Path) -> NodeSettings:
    return NodeSettings(
        node_name=NODE,
        device_plugin_dir=kubelet.directory,
        hook_dir=tmp_path / "hooks",
        metrics_listen="127.0.0.1:0",
        discovery_interval_seconds=0.05,
        register_interval_seconds=0.1,
        kubelet_poll_seconds=0.05,
        shutdown_grace_seconds=2,
    )


@pytest.fixture
def start_daemon(
    settings: NodeSettings, plugins: VendorPlugins, cluster: MemoryCluster
) -> Iterator[Callable[..., DaemonThread]]:
    started: list[DaemonThread] = []

    def start(**changes: object) -> DaemonThread:
        daemon = DaemonThread(settings.model_copy(update=changes), plugins, cluster).start()
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.stop()
