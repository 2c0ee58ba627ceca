"""`hami node`'s flags (`add_node_parser`) and `python -m hami.node`."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import scripted_vendor

from hami.cluster import MemoryCluster
from hami.errors import ConfigError
from hami.node.cli import add_node_parser, node_settings
from hami.node.daemon import NodeDaemon, NodeSettings
from hami.plugins import VendorPlugins


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="hami")
    add_node_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["node", *argv])


def test_flags_become_node_settings_and_omitted_ones_keep_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    settings = node_settings(parse("--hook-dir", "/opt/hami", "--discovery-interval", "2.5"))
    assert settings.node_name == "from-env"
    assert settings.hook_dir == Path("/opt/hami")
    assert settings.discovery_interval_seconds == 2.5
    assert settings.device_plugin_dir == Path("/var/lib/kubelet/device-plugins")
    assert settings.metrics_listen == "0.0.0.0:9394"
    assert node_settings(parse("--node-name", "flag-wins")).node_name == "flag-wins"


def test_bad_values_are_reported_by_flag_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "n")
    with pytest.raises(ConfigError, match=r"node.metricsListen: '9394' is not <host>:<port>"):
        node_settings(parse("--metrics-listen", "9394"))
    with pytest.raises(ConfigError, match="discoveryIntervalSeconds: Input should be greater than 0"):
        node_settings(parse("--discovery-interval", "0"))


def test_the_daemon_refuses_to_start_without_a_node_name() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    done = subprocess.run([sys.executable, "-m", "hami.node"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "hami: hami node needs this node's name: pass --node-name or set NODE_NAME" in done.stderr


def test_a_metrics_port_in_use_is_a_clear_start_up_error(settings: NodeSettings, plugins: VendorPlugins) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = NodeDaemon(
            settings.model_copy(update={"metrics_listen": f"127.0.0.1:{port}"}), plugins, MemoryCluster()
        )
        with pytest.raises(ConfigError, match=f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"):
            asyncio.run(daemon.serve(asyncio.Event()))


def test_at_start_up_the_vendors_are_told_which_pods_are_still_on_the_node(
    settings: NodeSettings, plugins: VendorPlugins
) -> None:
    # `hami_reconcile`: a restarted daemon lets each vendor undo what it made for pods deleted while it was down
    cluster = MemoryCluster()
    here = settings.node_name
    pods = [("here", here, "Running"), ("pending", here, "Pending"), ("done", here, "Succeeded"),
            ("elsewhere", "other", "Running")]  # fmt: skip
    for name, node, phase in pods:
        spec = {"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node}}
        cluster.create("pods", {**spec, "status": {"phase": phase}})
    scripted_vendor.RECONCILED.clear()
    NodeDaemon(settings, plugins, cluster)._start_up()
    assert scripted_vendor.RECONCILED
    assert all(pods == ["here", "pending"] for _, pods in scripted_vendor.RECONCILED)
    assert sorted(kind for kind, _ in scripted_vendor.RECONCILED) == sorted(k.common_word for k in plugins.kinds)
