"""The product on a real control plane, for the end-to-end tests: the chart applied, the services started.

Owns turning `helm template` of charts/hami into running processes on loopback, changing only what a
loopback test must (addresses, certificate paths, kubeconfigs, fake-driver paths):

* every rendered object the API server serves is applied with server-side apply (so the API server validates
  the chart's RBAC, ConfigMaps, Services, Deployment, DaemonSet, hook Jobs and webhook configuration);
* `hami scheduler` (extender + webhook) runs with the chart's `hami.yaml`, as the chart's scheduler
  ServiceAccount; its serving certificate comes from `hami webhook certs`;
* kube-scheduler runs with the chart's KubeSchedulerConfiguration, as the same ServiceAccount;
* the chart's MutatingWebhookConfiguration is registered with its clientConfig pointed at the loopback URL
  (the API server cannot reach a Service without kube-proxy) and the CA bundle;
* `DeviceNode`: a node registered by its kubelet (`e2e_kubelet.NodeKubelet`), with `hami node` (as the chart's
  node ServiceAccount) against fake drivers; `GpuNode` is one over NVIDIA's fake NVML describing its GPUs.
"""

from __future__ import annotations

import base64
import copy
import json
import subprocess
import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from control_plane import ROOT, Binaries, ControlPlane, Process, free_port, render_chart, wait_until, which_cc
from e2e_kubelet import NodeKubelet
from kube_rest import ApiError, KubeApi

from hami.testing.sandbox import CSRC

__all__ = ["DeviceNode", "GpuNode", "HamiStack", "build_fake_nvml", "gpu_box"]

CHART = ROOT / "charts" / "hami"
RELEASE = "hami"
NAMESPACE = "hami-system"
FAKE_NVML = ROOT / "vendors" / "nvidia" / "tests" / "fake_nvml" / "fake_nvml.c"
SERVED_KINDS = {
    "Namespace", "ConfigMap", "Secret", "Service", "ServiceAccount", "Deployment", "DaemonSet", "Job", "ClusterRole",
    "ClusterRoleBinding", "Role", "RoleBinding", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}  # fmt: skip
"""What the API server serves without extra CRDs (ServiceMonitor and cert-manager's kinds need their operators)."""


def _python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


class HamiStack:
    """The chart applied and the scheduler side running; `add_gpu_node` adds nodes."""

    def __init__(self, plane: ControlPlane, binaries: Binaries, workdir: Path) -> None:
        self.plane = plane
        self.binaries = binaries
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        assert plane.admin is not None
        self.admin: KubeApi = plane.admin
        self.extender_port = free_port()
        self.metrics_port = free_port()
        self.webhook_port = free_port()
        # The dashboard's port too: the chart's fixed 8090 would make two suites on one machine collide.
        self.dashboard_port = free_port()
        self.objects = render_chart(
            binaries.helm,
            CHART,
            RELEASE,
            NAMESPACE,
            binaries.kubernetes_version,
            **{
                "scheduler.extender.port": str(self.extender_port),
                "scheduler.metrics.port": str(self.metrics_port),
                "scheduler.admissionWebhook.port": str(self.webhook_port),
                "scheduler.dashboard.port": str(self.dashboard_port),
                "vendors.iluvatar.enabled": "true",  # off by default, as in HAMi; on here for test_iluvatar_pods.py
            },
        )
        self.scheduler: Process | None = None
        self.kube_scheduler: Process | None = None
        self.nodes: dict[str, DeviceNode] = {}
        self.scheduler_identity = plane.service_account(NAMESPACE, f"{RELEASE}-scheduler")
        self.node_identity = plane.service_account(NAMESPACE, f"{RELEASE}-node")

    # ---------------------------------------------------------------------------------- what the chart rendered

    def rendered(self, kind: str, name: str) -> dict[str, Any]:
        for obj in self.objects:
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return copy.deepcopy(obj)
        raise LookupError(f"the chart rendered no {kind} {name}")

    def hami_config(self) -> dict[str, Any]:
        """The chart's hami.yaml (or the one `use_config` gave)."""
        config: dict[str, Any] = yaml.safe_load(self.rendered("ConfigMap", f"{RELEASE}-config")["data"]["hami.yaml"])
        return config

    def use_config(self, hami_yaml: str) -> None:
        """Run the scheduler, from its next start, on this hami.yaml instead of the one the chart rendered (as a
        `helm upgrade` changes the ConfigMap the Deployment mounts)."""
        for obj in self.objects:
            if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == f"{RELEASE}-config":
                obj["data"]["hami.yaml"] = hami_yaml

    def disabled_vendors(self) -> str:
        """The chart's HAMI_DISABLED_VENDORS, plus the example plugin installed in development environments."""
        deployment = self.rendered("Deployment", f"{RELEASE}-scheduler")
        (container,) = [
            c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "hami-scheduler"
        ]
        chart = str({e["name"]: e.get("value", "") for e in container["env"]}["HAMI_DISABLED_VENDORS"])
        return ",".join(v for v in (chart, "exampleaccel") if v)

    # ---------------------------------------------------------------------------------- start

    def start(self) -> HamiStack:
        self.apply_chart()
        self.start_scheduler()
        self.register_webhook()
        self.start_kube_scheduler()
        return self

    def apply_chart(self) -> list[dict[str, Any]]:
        """Server-side apply of every rendered object the API server serves; returns what it answered."""
        try:
            self.admin.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        applied = []
        for obj in sorted(self.objects, key=lambda o: 0 if o["kind"] in ("ServiceAccount", "ConfigMap") else 1):
            if obj["kind"] in SERVED_KINDS:
                applied.append(self.admin.apply(obj))
        return applied

    def _write_scheduler_config(self) -> Path:
        config = self.hami_config()
        certs = self.dir / "webhook-tls"
        config["kubeconfig"] = str(self.scheduler_identity.kubeconfig)
        config["scheduler"]["metricsListen"] = f"127.0.0.1:{self.metrics_port}"
        config["webhook"]["listen"] = f"127.0.0.1:{self.webhook_port}"
        config["webhook"]["tls"] = {"certFile": str(certs / "tls.crt"), "keyFile": str(certs / "tls.key")}
        path = self.dir / "hami-scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def _make_webhook_certs(self) -> Path:
        """`hami webhook certs`, as the chart's hook Job runs it, plus the loopback address."""
        out = self.dir / "webhook-tls"
        argv = [*_python_module("hami.cli"), "webhook", "certs", "--service", f"{RELEASE}-webhook"]
        argv += ["--namespace", NAMESPACE, "--out", str(out), "--extra-san", "127.0.0.1"]
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        return out

    def start_scheduler(self) -> None:
        if not (self.dir / "webhook-tls" / "tls.crt").exists():
            self._make_webhook_certs()
        config = self._write_scheduler_config()
        argv = [*_python_module("hami.cli"), "--log-level", "debug", "scheduler", "--config", str(config)]
        self.scheduler = self.plane.start_process(
            "hami-scheduler", argv, env={"HAMI_DISABLED_VENDORS": self.disabled_vendors()}
        )

        def ready() -> bool:
            assert self.scheduler is not None
            if not self.scheduler.alive:
                raise RuntimeError(f"hami scheduler exited\n{self.scheduler.tail()}")
            with urllib.request.urlopen(f"http://127.0.0.1:{self.extender_port}/readyz", timeout=2) as response:
                return bool(response.status == 200)

        wait_until(ready, 60, "hami scheduler ready", self.plane.diagnose)

    def stop_scheduler(self) -> int | None:
        assert self.scheduler is not None
        status = self.scheduler.stop()
        self.plane.processes.remove(self.scheduler)
        return status

    def register_webhook(self) -> dict[str, Any]:
        """The chart's MutatingWebhookConfiguration, pointed at the loopback URL with the CA bundle; returns once
        the API server calls it (a dry-run pod comes back with the scheduler's name)."""
        config = self.rendered("MutatingWebhookConfiguration", f"{RELEASE}-webhook")
        ca = base64.b64encode((self.dir / "webhook-tls" / "ca.crt").read_bytes()).decode()
        for webhook in config["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}", "caBundle": ca}
        applied = self.admin.apply(config)
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "webhook-probe", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        }
        wait_until(
            lambda: self.admin.create(probe, dryRun="All")["spec"].get("schedulerName") == "hami-scheduler",
            60,
            "the API server calls the webhook",
            self.plane.diagnose,
        )
        return applied

    def kube_scheduler_config(self) -> dict[str, Any]:
        """The chart's KubeSchedulerConfiguration."""
        rendered = self.rendered("ConfigMap", f"{RELEASE}-scheduler-kube-scheduler")
        config: dict[str, Any] = yaml.safe_load(rendered["data"]["config.yaml"])
        return config

    def start_kube_scheduler(self) -> None:
        config = self.kube_scheduler_config()
        config["clientConnection"] = {"kubeconfig": str(self.scheduler_identity.kubeconfig)}
        path = self.dir / "kube-scheduler.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = [str(self.binaries.kube_scheduler), f"--config={path}", "--secure-port=0", "--v=2"]
        self.kube_scheduler = self.plane.start_process("kube-scheduler", argv, env={"GOMAXPROCS": "1"})
        lease = config["leaderElection"]

        def leading() -> bool:
            assert self.kube_scheduler is not None
            if not self.kube_scheduler.alive:
                raise RuntimeError(f"kube-scheduler exited\n{self.kube_scheduler.tail()}")
            try:
                got = self.admin.get("Lease", lease["resourceName"], lease["resourceNamespace"])
            except ApiError:
                return False
            return bool(got.get("spec", {}).get("holderIdentity"))

        wait_until(leading, 60, "kube-scheduler leads", self.plane.diagnose)

    # ---------------------------------------------------------------------------------- observing

    def scheduler_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    def diagnose(self) -> str:
        return self.plane.diagnose()

    def describe_pod(self, namespace: str, name: str) -> str:
        """A pod's metadata, status and events, and the components' logs: what a failed wait shows."""
        try:
            got = self.admin.get("Pod", name, namespace)
            events = [f"{e['reason']}: {e['message']}" for e in self.admin.events_about(namespace, name)]
        except ApiError as exc:
            return f"pod {namespace}/{name}: {exc}"
        return f"pod: {got.get('metadata')}\nstatus: {got.get('status')}\nevents: {events}\n{self.diagnose()}"

    def wait_running(self, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
        """The pod once it is Running; a timeout shows `describe_pod`."""

        def running() -> dict[str, Any] | None:
            got: dict[str, Any] = self.admin.get("Pod", name, namespace)
            return got if got.get("status", {}).get("phase") == "Running" else None

        found: dict[str, Any] = wait_until(
            running, timeout, f"pod {namespace}/{name} Running", lambda: self.describe_pod(namespace, name)
        )
        return found

    # ---------------------------------------------------------------------------------- nodes

    def add_gpu_node(self, name: str, box: Mapping[str, Any], library: Path, **nvidia: Any) -> GpuNode:
        node = GpuNode(self, name, dict(box), library, nvidia)
        self.add_node(node)
        return node

    def add_node(self, node: DeviceNode) -> DeviceNode:
        self.nodes[node.name] = node
        return node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()
        self.plane.stop()


def build_fake_nvml(directory: Path) -> Path:
    """NVIDIA's fake NVML (vendors/nvidia/tests/fake_nvml) as libnvidia-ml.so.1."""
    cc = which_cc()
    if cc is None:
        raise RuntimeError("no C compiler to build the fake NVML (set CC or install gcc)")
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "libnvidia-ml.so.1"
    argv = [cc, "-shared", f"-I{CSRC}", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1", "-o", str(out), str(FAKE_NVML)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    return out


def gpu_box(tag: str, count: int, name: str = "Tesla V100-PCIE-16GB", memory_mib: int = 16384) -> dict[str, Any]:
    """The fake NVML's description of a node with `count` identical GPUs (UUIDs GPU-<tag>-<i>...)."""
    devices = [
        {
            "uuid": f"GPU-{tag}{i:02d}0000-1111-2222-3333-44440000000{i}",
            "name": name,
            "memory_mib": memory_mib,
            "bus_id": f"00000000:{0x18 + i:02X}:00.0",
            "numa": 0,
        }
        for i in range(count)
    ]
    return {"driver": "550.54.15", "devices": devices}


class DeviceNode:
    """One node: its kubelet, and `hami node` with vendor settings and environment pointing at fake drivers.

    Before the node counts as up it must show `expect_allocatable`: per resource, the allocatable count the
    kubelet reports from the plugins' lists (None: any count above zero), and `expect_annotations`, published
    by the daemon."""

    def __init__(
        self,
        stack: HamiStack,
        name: str,
        vendors: Mapping[str, Mapping[str, Any]],
        env: Mapping[str, str],
        expect_allocatable: Mapping[str, str | None],
        expect_annotations: tuple[str, ...],
    ) -> None:
        self.stack = stack
        self.name = name
        self.dir = stack.dir / "nodes" / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.vendors = {k: dict(v) for k, v in vendors.items()}
        self.env = dict(env)
        self.expect_allocatable = dict(expect_allocatable)
        self.expect_annotations = expect_annotations
        self.kubelet = NodeKubelet(stack.admin, name, labels={"gpu": "on"})
        self.daemon: Process | None = None
        self.metrics_port = free_port()

    def start(self) -> DeviceNode:
        self.kubelet.start()
        config = self.stack.hami_config()
        for vendor, settings in self.vendors.items():
            config["vendors"].setdefault(vendor, {}).update(settings)
        path = self.dir / "hami-node.yaml"
        path.write_text(yaml.safe_dump(config))
        argv = [*_python_module("hami.node"), "--config", str(path)]
        argv += ["--kubeconfig", str(self.stack.node_identity.kubeconfig), "--node-name", self.name]
        argv += ["--device-plugin-dir", str(self.kubelet.devices.directory), "--hook-dir", str(self.dir / "hook")]
        argv += ["--metrics-listen", f"127.0.0.1:{self.metrics_port}", "--discovery-interval", "1"]
        argv += ["--register-interval", "1"]
        env = {**self.env, "HAMI_DISABLED_VENDORS": self.stack.disabled_vendors()}
        env.setdefault("POD_NAMESPACE", NAMESPACE)  # as the chart's DaemonSet: the node lock's Lease is offered
        self.daemon = self.stack.plane.start_process(f"hami-node-{self.name}", argv, env=env)

        def registered() -> bool:
            assert self.daemon is not None
            if not self.daemon.alive:
                raise RuntimeError(f"hami node {self.name} exited\n{self.daemon.tail()}")
            node = self.stack.admin.get("Node", self.name)
            annotations = node["metadata"].get("annotations") or {}
            allocatable = node["status"].get("allocatable", {})
            return all(a in annotations for a in self.expect_annotations) and all(
                allocatable.get(r) == n if n is not None else allocatable.get(r, "0") != "0"
                for r, n in self.expect_allocatable.items()
            )

        wait_until(
            registered,
            60,
            f"node {self.name} registered {self.expect_annotations} with allocatable {self.expect_allocatable}",
            self.stack.diagnose,
        )
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        self.kubelet.stop()


class GpuNode(DeviceNode):
    """A node of NVIDIA GPUs: `hami node` over the fake NVML describing `box`."""

    def __init__(self, stack: HamiStack, name: str, box: dict[str, Any], library: Path, nvidia: Mapping[str, Any]):
        self.box = box
        root = stack.dir / "nodes" / name
        root.mkdir(parents=True, exist_ok=True)
        nvml = root / "nvml.json"
        nvml.write_text(json.dumps(box))
        for device in box["devices"]:
            numa = root / "sys" / "bus" / "pci" / "devices" / device["bus_id"].lower()[4:] / "numa_node"
            numa.parent.mkdir(parents=True, exist_ok=True)
            numa.write_text(f"{device.get('numa', 0)}\n")
        settings = {
            "nvmlLibrary": str(library),
            "sysfsRoot": str(root / "sys"),
            "hookPath": str(root / "usr"),
            **nvidia,
        }
        split = int({**stack.hami_config()["vendors"]["nvidia"], **settings}.get("deviceSplitCount", 10))
        env = {
            "FAKE_NVML_CONFIG": str(nvml),
            "FAKE_NVML_LOG": str(root / "nvml.log"),
            "FAKE_NVML_EVENTS": str(root / "nvml.events"),
        }
        super().__init__(
            stack,
            name,
            {"nvidia": settings},
            env,
            {"nvidia.com/gpu": str(len(box["devices"]) * split)},
            ("hami.io/node-nvidia-register",),
        )

    @property
    def uuids(self) -> list[str]:
        return [str(d["uuid"]) for d in self.box["devices"]]
