"""The client side of one API call: CPU per request of the project's `KubeCluster` against the `kubernetes` client's
own request path and a bare `http.client` connection, on a real kube-apiserver.

    python benchmarks/kube_client.py                 # 200 calls per round and way, median of 15 rounds
    python benchmarks/kube_client.py --calls 500 --rounds 9

Starts etcd and kube-apiserver from the end-to-end suite's binaries (tests/e2e/build_control_plane.sh), creates one
node whose annotations are the size of a 8-GPU register, and merge-patches one of its annotations again and again,
as a scheduler's node lock does: through `KubeCluster.patch_metadata` (this project: from a kubeconfig, through
urllib3, and as a pod connects, `KubeCluster.in_cluster` with a ServiceAccount's token, through `Connections`),
through the client's generated
`CoreV1Api.patch_node` asked for the raw answer (`_preload_content=False`: the client's request layer, no model),
and through one kept-alive `http.client.HTTPSConnection` (the floor: one TLS request and its JSON, nothing more).
A watch of the node, through `KubeCluster.watch`, reports the CPU its thread spends per event delivered.
Each figure is the calling thread's CPU time per call (what competes for the interpreter and the cores with a
scheduler's filters), the median of --rounds that take the three ways in turn; wall time beside it.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import ssl
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from kubernetes import client as k8s_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

from control_plane import ControlPlane, find_binaries  # noqa: E402

from hami.cluster import WatchEvent, meta  # noqa: E402
from hami.cluster.kube import KubeCluster  # noqa: E402
from hami.cluster.kube_transport import kubeconfig_api_client  # noqa: E402

NODE = "node-00000"


def measure(calls: dict[str, Callable[[int], object]], count: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Name → (CPU ms, wall ms) per call, the median over `rounds`; the rounds take the ways in turn, so a machine
    whose speed drifts shifts them all alike."""
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            c0, t0 = time.thread_time(), time.perf_counter()
            for i in range(count):
                call(i)
            cpu[name].append((time.thread_time() - c0) / count * 1e3)
            wall[name].append((time.perf_counter() - t0) / count * 1e3)
    return {name: (statistics.median(cpu[name]), statistics.median(wall[name])) for name in calls}


class WatchCost:
    """A watch handler that takes the watch thread's CPU clock at each event: CPU per event, from the first to
    the last, of reading the stream, parsing each event and delivering it."""

    def __init__(self) -> None:
        self.events = 0
        self.first = self.last = 0.0
        self._all = threading.Condition()

    def __call__(self, event: WatchEvent) -> None:
        now = time.thread_time()
        with self._all:
            self.events += 1
            if self.events == 1:
                self.first = now
            self.last = now
            self._all.notify_all()

    def per_event(self, expected: int, timeout: float = 30.0) -> float:
        with self._all:
            self._all.wait_for(lambda: self.events >= expected, timeout)
            return (self.last - self.first) / max(self.events - 1, 1) * 1e3


def bare_connection(kubeconfig: Path) -> Callable[[int], object]:
    """One kept-alive HTTPS connection with the kubeconfig's client certificate: request, read, parse."""
    config = yaml.safe_load(kubeconfig.read_text())
    user, cluster = config["users"][0]["user"], config["clusters"][0]["cluster"]
    context = ssl.create_default_context(cafile=cluster["certificate-authority"])
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    server = urlsplit(cluster["server"])
    connection = http.client.HTTPSConnection(server.hostname or "", server.port, context=context)
    headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}

    def call(i: int) -> object:
        body = json.dumps({"metadata": {"annotations": {"bench": str(i)}}}).encode()
        connection.request("PATCH", f"/api/v1/nodes/{NODE}", body=body, headers=headers)
        return json.loads(connection.getresponse().read())

    return call


def service_account(plane: ControlPlane, folder: Path) -> Path:
    """A ServiceAccount bound to cluster-admin, its token and the cluster's CA in `folder` as the kubelet mounts
    them, and the API server's address in KUBERNETES_SERVICE_HOST/PORT: what `KubeCluster.in_cluster` reads."""
    api = plane.admin
    assert api is not None
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "bench", "namespace": "default"}})
    api.create(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "bench", "namespace": "default"}],
        }
    )
    answer = api.request(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/bench/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    folder.mkdir()
    (folder / "token").write_text(answer["status"]["token"])
    (folder / "ca.crt").write_bytes(Path(plane.pki.ca).read_bytes())
    host, port = plane.server.removeprefix("https://").rsplit(":", 1)
    os.environ.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="calls per round and way")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hami-bench-client-"))
    plane = ControlPlane(find_binaries(), work / "cluster").start()
    try:
        assert plane.admin is not None
        register = "x" * 1200  # about what 8 GPUs' hami.io/node-nvidia-register takes
        plane.admin.create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "annotations": {"register": register}}}
        )
        kubeconfig = Path(plane.identity("admin", "hami-e2e-admin").kubeconfig)
        cluster = KubeCluster.from_kubeconfig(str(kubeconfig))
        pod = KubeCluster.in_cluster(account=service_account(plane, work / "serviceaccount"))
        core = k8s_client.CoreV1Api(kubeconfig_api_client(str(kubeconfig)))  # its own pool, sized alike

        def ours(i: int) -> object:
            return cluster.patch_metadata("nodes", NODE, annotations={"bench": str(i)})

        def in_cluster(i: int) -> object:
            return pod.patch_metadata("nodes", NODE, annotations={"bench": str(i)})

        def generated(i: int) -> object:
            answer = core.patch_node(
                NODE, {"metadata": {"annotations": {"bench": str(i)}}}, _preload_content=False
            )  # the client picks the patch type from the body: a merge patch for a dict
            return json.loads(answer.data)

        watched = WatchCost()
        since = str(meta(cluster.get("nodes", NODE)).get("resourceVersion"))
        cluster.watch("nodes", since, watched)
        ways = {
            "kubecluster": ours,
            "kubecluster_in_cluster": in_cluster,
            "kubernetes_client": generated,
            "bare_http_client": bare_connection(kubeconfig),
        }
        for call in ways.values():
            call(0)  # open each connection outside the measure
        figures: dict[str, float] = {}
        for name, (cpu, wall) in measure(ways, args.calls, args.rounds).items():
            figures[f"{name}_cpu_ms"] = round(cpu, 3)
            figures[f"{name}_wall_ms"] = round(wall, 3)
            print(f"{name:18} {cpu:6.3f} ms CPU per call   {wall:6.3f} ms wall", flush=True)
        expected = len(ways) * (args.calls * args.rounds + 1)
        figures["watch_cpu_ms_per_event"] = round(watched.per_event(expected), 3)
        print(f"watch              {figures['watch_cpu_ms_per_event']:6.3f} ms CPU per event (read, parse, deliver)")
        cluster.close()
        pod.close()
        print(json.dumps({"calls": args.calls, "rounds": args.rounds, **figures}))
    finally:
        plane.stop()


if __name__ == "__main__":
    main()
