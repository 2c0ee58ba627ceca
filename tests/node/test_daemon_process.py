"""The real daemon process (`python -m hami.node`) against the fake kubelet and the fake Kubernetes API server.

One daemon serves the whole module, in the order a node lives: it starts and registers, publishes its
devices, answers the handshake, pushes a health change, allocates pods, survives a kubelet restart, and
stops on SIGTERM. The scripted vendor is installed into the process's path like any vendor package, with a
dummy isolation library compiled by the test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer
from node_harness import (
    NODE,
    DaemonProcess,
    build_library,
    dev,
    eventually,
    free_port,
    install_scripted_vendor,
    node_annotations,
    place_pod,
    pod_annotations,
    scrape,
    scripted_devices,
    write_script,
)

from hami.cluster.locks import LOCK_ANNOTATION
from hami.codec import Handshake, decode_handshake, decode_node_register, encode_handshake
from hami.scheduler.extender import BIND_PHASE
from hami.testing.kubelet import FakeKubelet, PluginCallError

RESOURCE = "scripted.example/accel"
REGISTER = "hami.io/node-scripted-register"
HANDSHAKE = "hami.io/node-handshake-scripted"


@dataclass
class Node:
    api: FakeApiServer
    kubelet: FakeKubelet
    daemon: DaemonProcess
    script: Path
    hooks: Path
    metrics_port: int

    def diagnose(self) -> str:
        return "daemon log:\n" + self.daemon.log()[-4000:]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("node-process")
    library = build_library(tmp / "build")
    site = install_scripted_vendor(tmp / "site", library)
    script = write_script(tmp / "script.json", {"Scripted": scripted_devices(2)})
    config = tmp / "hami.yaml"
    hooks = tmp / "hooks"
    config.write_text(json.dumps({"vendors": {"scripted": {"script": str(script)}}}))
    api = FakeApiServer().start()
    api.cluster.create("nodes", {"metadata": {"name": NODE}})
    kubelet = FakeKubelet().start()
    port = free_port()
    args = ["--config", str(config), "--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
    args += ["--node-name", NODE, "--device-plugin-dir", str(kubelet.directory), "--hook-dir", str(hooks)]
    args += ["--metrics-listen", f"127.0.0.1:{port}", "--discovery-interval", "0.1", "--register-interval", "0.2"]
    daemon = DaemonProcess(args, site, tmp / "daemon.log")
    world = Node(api, kubelet, daemon, script, hooks, port)
    try:
        yield world
    finally:
        daemon.kill()
        kubelet.stop()
        api.stop()


def test_metrics_exist_at_zero_before_any_pod(node: Node) -> None:
    kubelet = node.kubelet
    kubelet.wait_for_registration(RESOURCE, timeout=30)
    text = eventually(lambda: _scrape_or_none(node.metrics_port), what="metrics served")
    device = 'device_index="1",device_type="Scripted",device_uuid="SCR-1",node="node-a"'
    assert f"hami_host_gpu_memory_used_bytes{{{device}}} 0.0" in text
    assert f"hami_host_gpu_utilization_ratio{{{device}}} 0.0" in text
    for family in (
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_utilization_ratio",
        "hami_container_last_kernel_elapsed_seconds",
    ):
        assert f"# TYPE {family} gauge" in text


def _scrape_or_none(port: int) -> str | None:
    try:
        return scrape(port)
    except OSError:
        return None


def test_each_resource_is_registered_with_its_shared_device_ids(node: Node) -> None:
    registration = node.kubelet.wait_for_registration(RESOURCE, timeout=30)
    assert (registration.version, registration.endpoint) == ("v1beta1", "hami-scripted.example_accel.sock")
    devices = node.kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    assert [d.id for d in devices[:5]] == ["SCR-0-0", "SCR-0-1", "SCR-0-2", "SCR-0-3", "SCR-1-0"]
    assert all(d.healthy for d in devices)
    assert {d.id: d.numa for d in devices}["SCR-1-3"] == (1,)


def test_devices_are_published_on_the_node_and_the_handshake_answered(node: Node) -> None:
    cluster = node.api.cluster
    published = eventually(lambda: node_annotations(cluster, NODE).get(REGISTER), what="register annotation")
    assert [(d.id, d.count, d.devmem, d.numa, d.health) for d in decode_node_register(published)] == [
        ("SCR-0", 4, 8192, 0, True),
        ("SCR-1", 4, 8192, 1, True),
    ]
    asked = encode_handshake(Handshake("Requesting", datetime(2025, 1, 2, 3, 4, 5)))
    cluster.patch_metadata("nodes", NODE, annotations={HANDSHAKE: asked})
    answered = eventually(
        lambda: (v := node_annotations(cluster, NODE).get(HANDSHAKE)) != asked and v, what="handshake answered"
    )
    assert decode_handshake(answered).state == "Reported"


def test_a_health_change_is_pushed_through_list_and_watch(node: Node) -> None:
    kubelet = node.kubelet
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    sick = scripted_devices(2)
    sick[1]["health"] = False
    write_script(node.script, {"Scripted": sick})
    devices = kubelet.wait_for_devices(RESOURCE, lambda ds: not all(d.healthy for d in ds))
    assert {d.id for d in devices if not d.healthy} == {"SCR-1-0", "SCR-1-1", "SCR-1-2", "SCR-1-3"}
    eventually(lambda: '"health"' not in node_annotations(node.api.cluster, NODE)[REGISTER].split("SCR-1")[1])
    write_script(node.script, {"Scripted": scripted_devices(2)})
    kubelet.wait_for_devices(RESOURCE, lambda ds: all(d.healthy for d in ds))


def test_allocate_gives_the_container_its_devices_and_the_installed_library(node: Node) -> None:
    cluster = node.api.cluster
    place_pod(cluster, NODE, "one", {"Scripted": [[dev("SCR-0", mem=2000, cores=20)]]})
    edits = node.kubelet.start_container(RESOURCE, 1)
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-0"
    mounts = {m.container_path: m for m in edits.mounts}
    stable = node.hooks / "scripted" / "libscripted.so"
    assert mounts[str(stable)].host_path == str(stable)
    build = stable.resolve()  # what the container's bind mount resolves to: the versioned build
    assert build.parent == node.hooks / "scripted"
    assert build.name.startswith("libscripted-0.1.0-")
    assert build.suffix == ".so"
    preload = Path(mounts["/etc/ld.so.preload"].host_path)
    assert preload.read_text() == f"{stable}\n"
    got = pod_annotations(cluster, "one")
    assert (got["hami.io/scripted-devices-to-allocate"], got[BIND_PHASE]) == (";", "success")
    assert LOCK_ANNOTATION not in node_annotations(cluster, NODE)
    text = scrape(node.metrics_port)
    labels = 'container="c0",device_uuid="SCR-0",namespace="default",pod="one",vdevice_index="0"'
    assert f"hami_vgpu_memory_limit_bytes{{{labels}}} 2.097152e+09" in text  # 2000 MiB, from the placement
    assert f"hami_vgpu_memory_used_bytes{{{labels}}} 0.0" in text


def test_multi_container_and_init_container_pods_are_served_in_order(node: Node) -> None:
    cluster = node.api.cluster
    place_pod(cluster, NODE, "multi", {"Scripted": [[dev("SCR-1")], [], [dev("SCR-0"), dev("SCR-1")]]}, init=1)
    first = node.kubelet.start_container(RESOURCE, 1)
    assert LOCK_ANNOTATION in node_annotations(cluster, NODE)
    second = node.kubelet.start_container(RESOURCE, 2)
    assert (first.env["SCRIPTED_CONTAINER"], second.env["SCRIPTED_CONTAINER"]) == ("0", "2")
    assert pod_annotations(cluster, "multi")[BIND_PHASE] == "success"
    assert LOCK_ANNOTATION not in node_annotations(cluster, NODE)


def test_allocate_for_a_pod_without_a_lock_is_refused_with_a_clear_error(node: Node) -> None:
    cluster = node.api.cluster
    place_pod(cluster, NODE, "left", {"Scripted": [[dev("SCR-0")]]}, lock=False)
    place_pod(cluster, NODE, "right", {"Scripted": [[dev("SCR-1")]]}, lock=False)
    with pytest.raises(PluginCallError) as refused:
        node.kubelet.start_container(RESOURCE, 1)
    assert refused.value.code == "FAILED_PRECONDITION"
    assert refused.value.details == (
        f"node {NODE} has no lock naming the pod being started, and 2 pods are allocating Scripted devices here "
        "(default/left, default/right): refusing to guess which one the kubelet is starting"
    )
    for name in ("left", "right"):
        cluster.delete("pods", name, "default")


def test_the_daemon_registers_again_after_the_kubelet_restarts(node: Node) -> None:
    kubelet = node.kubelet
    kubelet.restart()
    registration = kubelet.wait_for_registration(RESOURCE, generation=kubelet.generation, timeout=10)
    assert registration.generation == 2
    assert len(kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)) == 8
    place_pod(node.api.cluster, NODE, "after-restart", {"Scripted": [[dev("SCR-1")]]})
    assert kubelet.start_container(RESOURCE, 1).env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"


def test_sigterm_stops_serving_and_removes_the_sockets(node: Node) -> None:
    plugin_socket = node.kubelet.directory / "hami-scripted.example_accel.sock"
    assert plugin_socket.exists()
    assert node.daemon.terminate() == 0, node.diagnose()
    assert not plugin_socket.exists()
    assert sorted(p.name for p in node.kubelet.directory.iterdir()) == ["kubelet.sock"]
    assert "node daemon stopped" in node.daemon.log()
    assert LOCK_ANNOTATION not in node_annotations(node.api.cluster, NODE)
