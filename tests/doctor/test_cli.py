"""`hami doctor` as a script uses it: JSON, exit status, and clear words (never a traceback) when it cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer

from hami.cluster.nodelease import LEASE_ANNOTATION
from hami.doctor.remote import RemoteError, daemon_pod, parse_report

HAMI = [sys.executable, "-m", "hami.cli"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HAMI, *args], capture_output=True, text=True, timeout=120, check=False, env=env)


def test_json_on_a_node_without_a_kubelet_fails_with_exit_status_1_and_one_json_line(tmp_path: Path) -> None:
    done = _run(
        "doctor",
        "--json",
        "--no-cluster",
        "--device-plugin-dir",
        str(tmp_path / "dp"),
        "--hook-dir",
        str(tmp_path / "hook"),
    )
    assert done.returncode == 1, done.stderr
    [line] = done.stdout.splitlines()
    report = json.loads(line)
    by_check = {(f["vendor"], f["check"]): f for f in report["findings"]}
    assert by_check[("", "kubelet socket")]["status"] == "failed"
    assert by_check[("", "kubelet socket")]["fix"]
    assert by_check[("", "clock")]["status"] == "warning"
    assert report["exit"] == 1
    assert report["summary"]["failed"] >= 1
    assert report["scope"] == "node"
    assert {v for v, _ in by_check} >= {"", "nvidia"}
    assert "Traceback" not in done.stderr


def test_an_unreachable_cluster_is_the_clock_checks_warning(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    done = _run("doctor", "--json", "--kubeconfig", str(kubeconfig), "--device-plugin-dir", str(tmp_path))
    clock = next(f for f in json.loads(done.stdout)["findings"] if f["check"] == "clock")
    assert clock["status"] == "warning"
    assert "could not be read" in clock["detail"]


def test_node_with_a_kubeconfig_that_does_not_load_says_so_with_exit_status_2(tmp_path: Path) -> None:
    done = _run("doctor", "--node", "gpu-1", "--kubeconfig", str(tmp_path / "absent"))
    assert done.returncode == 2
    assert "cannot load" in done.stderr
    assert "Traceback" not in done.stderr


def test_container_and_node_are_exclusive() -> None:
    done = _run("doctor", "--container", "--node", "x")
    assert done.returncode == 2
    assert "not allowed with" in done.stderr


def _pod(name: str, node: str, phase: str = "Running", container: str = "hami-node") -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "hami-system"},
        "spec": {"nodeName": node, "containers": [{"name": container}]},
        "status": {"phase": phase},
    }


def test_the_node_daemon_pod_is_the_running_one_on_that_node() -> None:
    pods = [_pod("a", "gpu-1", "Pending"), _pod("b", "gpu-2"), _pod("c", "gpu-1"), _pod("d", "gpu-1", container="x")]
    assert daemon_pod(pods, "gpu-1") == ("hami-system", "c")
    with pytest.raises(RemoteError, match=r"no running node daemon pod on node 'gpu-1' \(found a \(Pending\)\)"):
        daemon_pod(pods[:1], "gpu-1")
    with pytest.raises(RemoteError, match="kubectl get pods"):
        daemon_pod([], "gpu-9")


def test_a_remote_report_that_is_not_one_is_an_error_naming_what_was_printed() -> None:
    assert parse_report('{"findings": []}\n', "node x") == {"findings": []}
    with pytest.raises(RemoteError, match="'usage: hami"):
        parse_report("usage: hami [-h]\nhami: error: invalid choice: 'doctor'\n", "node x")
    with pytest.raises(RemoteError, match="printed 'nothing'"):
        parse_report("", "node x")


def test_the_node_lock_check_reads_the_offer_and_its_lease_through_the_kubeconfig(tmp_path: Path) -> None:
    """`hami doctor` on a node whose daemon offers its lock Lease, read from an API server through a kubeconfig."""
    api = FakeApiServer().start()
    try:
        api.cluster.create(
            "nodes", {"metadata": {"name": "gpu-1", "annotations": {LEASE_ANNOTATION: "hami/hami-node-lock-gpu-1"}}}
        )
        owner = [{"apiVersion": "v1", "kind": "Pod", "name": "hami-node-abc", "uid": "u1"}]
        api.cluster.create(
            "leases", {"metadata": {"name": "hami-node-lock-gpu-1", "namespace": "hami", "ownerReferences": owner}}
        )
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        env = {**os.environ, "NODE_NAME": "gpu-1"}
        done = _run("doctor", "--json", "--kubeconfig", str(kubeconfig), "--device-plugin-dir", str(tmp_path), env=env)
        lock = next(f for f in json.loads(done.stdout)["findings"] if f["check"] == "node lock")
        assert lock["status"] == "ok", lock
        assert "Lease hami/hami-node-lock-gpu-1, owned by pod hami-node-abc" in lock["detail"]
        api.cluster.delete("leases", "hami-node-lock-gpu-1", "hami")
        done = _run("doctor", "--json", "--kubeconfig", str(kubeconfig), "--device-plugin-dir", str(tmp_path), env=env)
        lock = next(f for f in json.loads(done.stdout)["findings"] if f["check"] == "node lock")
        assert (lock["status"], "does not exist" in lock["detail"]) == ("warning", True)
    finally:
        api.stop()
