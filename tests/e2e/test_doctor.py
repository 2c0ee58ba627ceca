"""`hami doctor` on a running node: the node daemon serving fake GPUs to a kubelet, a real kube-apiserver beside it.

The doctor is run as an operator runs it in the daemon's container: the daemon's configuration file, its identity
(the node daemon's ServiceAccount), its device-plugin and hook directories. What a node that works must show: the
kubelet's socket answering, the plugin registered (the Node's allocatable, read from the API server), the installed
isolation library loading, the clock agreeing with the API server's, and NVIDIA's management library (the fake
NVML) with its GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hami_stack import HamiStack

pytestmark = pytest.mark.e2e


def test_doctor_on_a_running_gpu_node_passes_the_checks_the_daemon_depends_on(stack: HamiStack) -> None:
    node = stack.nodes["gpu-node-1"]
    argv = [sys.executable, "-m", "hami.cli", "doctor", "--json", "--config", str(node.dir / "hami-node.yaml"),
            "--kubeconfig", str(stack.node_identity.kubeconfig), "--device-plugin-dir",
            str(node.kubelet.devices.directory), "--hook-dir", str(node.dir / "hook")]  # fmt: skip
    env = {**os.environ, **node.env, "NODE_NAME": node.name, "HAMI_DISABLED_VENDORS": stack.disabled_vendors()}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)
    report = json.loads(done.stdout)
    found = {(f["vendor"], f["check"]): f for f in report["findings"]}
    for key in [("", "kubelet socket"), ("", "device plugin registration nvidia.com/gpu"), ("", "clock"),
                ("nvidia", "ld.so.preload for containers"), ("nvidia", "management library")]:  # fmt: skip
        assert found[key]["status"] == "ok", (key, found[key], done.stderr[-2000:])
    assert "allocatable" in found[("", "device plugin registration nvidia.com/gpu")]["detail"]
    assert "2 device(s)" in found[("nvidia", "management library")]["detail"]
    assert "Traceback" not in done.stderr


def test_doctor_through_the_cluster_finds_the_daemons_pod_and_says_why_exec_failed(stack: HamiStack, ns: str) -> None:
    """The test's kubelet serves no exec: what an operator sees when the API server cannot reach a kubelet, after
    the daemon's pod was found by its label and node through the real API server."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hami-node-x", "namespace": ns, "labels": {"app.kubernetes.io/component": "node"}},
        "spec": {"nodeName": "gpu-node-2", "containers": [{"name": "hami-node", "image": "hami:test"}]},
    }
    stack.admin.create(pod)
    stack.wait_running(ns, "hami-node-x")
    kubeconfig = stack.plane.identities["admin"].kubeconfig
    argv = [sys.executable, "-m", "hami.cli", "doctor", "--node", "gpu-node-2", "--kubeconfig", str(kubeconfig)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert f"exec in {ns}/hami-node-x failed" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([*argv[:5], "no-such-node", *argv[6:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "no running node daemon pod on node 'no-such-node'" in done.stderr
