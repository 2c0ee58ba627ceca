"""The fake kubelet itself (`hami.testing.kubelet`): what it accepts, and what its restart does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
import scripted_vendor
from node_harness import NODE, DaemonThread, write_script

from hami.cluster import MemoryCluster
from hami.node.daemon import NodeSettings
from hami.node.kubelet import KubeletSocket, RegistrationError
from hami.node.proto import deviceplugin_pb2 as pb
from hami.node.proto import deviceplugin_pb2_grpc as pb_grpc
from hami.plugins import VendorPlugins
from hami.testing.kubelet import FakeKubelet


def test_a_registration_with_another_api_version_is_refused(kubelet: FakeKubelet) -> None:
    request = pb.RegisterRequest(version="v1alpha1", endpoint="x.sock", resource_name="example.com/x")
    with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
    assert refused.value.details() == "unsupported API version 'v1alpha1'; want v1beta1"  # type: ignore[attr-defined]
    assert kubelet.registrations == []


def test_the_daemons_registration_client_reports_a_missing_kubelet(tmp_path: Path) -> None:
    socket = KubeletSocket(tmp_path)
    with pytest.raises(RegistrationError, match=r"registering example.com/x with the kubelet at .*kubelet.sock failed"):
        asyncio.run(socket.register("x.sock", "example.com/x", pb.DevicePluginOptions(), timeout=1))


def test_restart_removes_every_socket_and_serves_a_new_kubelet_sock(kubelet: FakeKubelet) -> None:
    (kubelet.directory / "stale.txt").write_text("not a socket")
    before = KubeletSocket(kubelet.directory).identity()
    kubelet.restart()
    assert kubelet.generation == 2
    assert KubeletSocket(kubelet.directory).identity() not in (None, before)
    assert sorted(p.name for p in kubelet.directory.iterdir()) == ["kubelet.sock", "stale.txt"]


def test_the_daemon_waits_for_a_kubelet_that_is_not_there_yet(tmp_path: Path, cluster: MemoryCluster) -> None:
    script = write_script(tmp_path / "script.json", {"Scripted": [{"id": "SCR-0", "count": 2}]})
    plugins = VendorPlugins.from_plugins({"scripted": scripted_vendor}, config={"scripted": {"script": str(script)}})
    late = FakeKubelet()  # its directory exists, its kubelet.sock not yet
    settings = NodeSettings(
        node_name=NODE,
        device_plugin_dir=late.directory,
        hook_dir=tmp_path / "hooks",
        metrics_listen="127.0.0.1:0",
        discovery_interval_seconds=0.05,
        kubelet_poll_seconds=0.05,
    )
    daemon = DaemonThread(settings, plugins, cluster).start()
    try:
        late.start()
        assert late.wait_for_registration("scripted.example/accel").generation == 1
        assert [d.id for d in late.wait_for_devices("scripted.example/accel")] == ["SCR-0-0", "SCR-0-1"]
    finally:
        daemon.stop()
        late.stop()
