"""What `hami demo` runs: an in-memory cluster on loopback and the real HAMi components around it.

Owns starting, waiting for and stopping:

* the **cluster**: a `MemoryCluster` served over HTTPS by `hami.testing.apiserver.ClusterApiServer` in this
  process, with a kubeconfig (bearer token, the run's CA) in the work directory that `kubectl` uses as it is;
  the inventory's nodes are created in it
  (labels, allocatable CPU and memory, Ready), then the examples' namespaces and resource quotas;
* the **scheduler**: `hami scheduler` as a child process (through `KubeCluster`, like on a cluster),
  serving the extender and, in the same process with the same quota ledger, the admission webhook over
  HTTPS with a certificate for 127.0.0.1 issued by a CA made for the run (`hami.webhook.certs`), and the web
  dashboard (`hami.dashboard`) on a port of its own;
* per node, a **fake kubelet** (`hami.testing.kubelet.FakeKubelet`, in this process, on its own
  device-plugin folder) and **`hami node`** as a child process reading its devices from the inventory
  (`--simulated-inventory`, re-read every 2 s so an edit of the file shows at once), with a folder of its own for
  what it installs and its metrics on one port shared by all nodes, each node on a loopback address of its own
  (127.0.0.10, .11, ...: the Node's InternalIP), so the dashboard reaches every node daemon as on a cluster
  (`dashboardNodeMetrics: http://{address}:<port>/metrics`). Where the system gives no loopback address but
  127.0.0.1, each node gets a port of its own instead and the dashboard reads no usage.

Each component's configuration is the demo's configuration file (the `hami.config` format; `${HAMI_DEMO_DIR}`
and `${NODE_NAME}` replaced) with the demo's addresses and paths over it. Children log into
`<workdir>/logs/`; a child that exits early stops the demo with the end of its log.

Ready means: the scheduler and webhook answer `/readyz`, every node daemon registered each of its resources
with its kubelet and published its devices on its Node, the scheduler's metrics list every device (so
its watch has seen them), and its dashboard answers. Ports are chosen free on 127.0.0.1 just before the
components start.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hami.cluster.memory import MemoryCluster
from hami.cluster.port import Resource, meta
from hami.config import HamiConfig
from hami.errors import ConfigError, HamiError
from hami.node.devices import resources_of
from hami.node.simulated import InventoryFile, SimulatedNode
from hami.plugins import VendorPlugins
from hami.testing.apiserver import ClusterApiServer
from hami.testing.kubelet import FakeKubelet
from hami.validation import describe, nearest

__all__ = ["DemoError", "DemoWorld", "NodeSide", "free_port"]

log = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 90.0
"""A bound on waiting for the components (a slow machine starts five Python processes at once)."""


class DemoError(HamiError):
    """The demo cannot go on: a component did not start, or a step failed unexpectedly."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """A component running as a child process, logging into `log`."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in text[-lines:])


@dataclass
class NodeSide:
    """One simulated node: its inventory entry, fake kubelet, daemon process and metrics port."""

    node: SimulatedNode
    kubelet: FakeKubelet
    metrics_port: int
    resources: dict[str, str] = field(default_factory=dict)
    """Resource name → device kind, for every resource this node's daemon serves."""
    child: Child | None = None
    address: str = "127.0.0.1"
    """The node's InternalIP: where its daemon's metrics listen."""

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}:{self.metrics_port}/metrics"


def _loopback_aliases() -> bool:
    """Whether this system answers on loopback addresses other than 127.0.0.1 (Linux does, macOS does not)."""
    with contextlib.suppress(OSError), socket.socket() as probe:
        probe.bind(("127.0.0.10", 0))
        return True
    return False


def node_address(position: int) -> str:
    """The loopback address of the inventory's `position`-th node (127.0.0.10 on)."""
    return f"127.{(10 + position) // 65536 % 256}.{(10 + position) // 256 % 256}.{(10 + position) % 256}"


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class DemoWorld:
    """The running demo. `start()` brings everything up and waits until it is ready; `stop()` ends it all."""

    def __init__(
        self,
        *,
        inventory: InventoryFile,
        inventory_path: Path,
        config_text: str,
        config_source: str,
        setup: Sequence[tuple[str, dict[str, Any]]],
        workdir: Path,
        log_level: str = "info",
    ) -> None:
        self.inventory = inventory
        self.inventory_path = inventory_path.resolve()
        self.config_text = config_text
        self.config_source = config_source
        self.setup = list(setup)
        self.workdir = workdir.resolve()
        self.log_level = log_level
        self.cluster = MemoryCluster()
        self.api: ClusterApiServer | None = None
        self.children: list[Child] = []
        self.nodes: dict[str, NodeSide] = {}
        self.kubeconfig = self.workdir / "kubeconfig"
        self.tls_dir = self.workdir / "tls"
        self.scheduler_port = 0
        self.scheduler_metrics_port = 0
        self.dashboard_port = 0
        self.webhook_port = 0
        self.node_metrics_port = 0
        """With loopback aliases, the port every node daemon's metrics listen on (each on its own address)."""
        self.plugins: VendorPlugins | None = None
        self.base_config: dict[str, Any] = self._config("")

    # ---------------------------------------------------------------------------------- configuration

    def _config(self, node: str) -> dict[str, Any]:
        """The demo's configuration file for one component, variables replaced; validated."""
        import yaml

        text = string.Template(self.config_text).safe_substitute(HAMI_DEMO_DIR=str(self.workdir), NODE_NAME=node)
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{self.config_source} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{self.config_source}: the top level must be a mapping of sections")
        try:
            HamiConfig.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(describe(exc, HamiConfig, self.config_source)) from None
        return raw

    def _write_config(self, name: str, raw: Mapping[str, Any]) -> Path:
        path = self.workdir / "config" / f"{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(raw, indent=2) + "\n")
        return path

    @property
    def scheduler_url(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_port}"

    @property
    def webhook_url(self) -> str:
        return f"https://127.0.0.1:{self.webhook_port}"

    @property
    def scheduler_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.scheduler_metrics_port}/metrics"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}/"

    @property
    def ca_file(self) -> Path:
        return self.tls_dir / "ca.crt"

    # ---------------------------------------------------------------------------------- starting

    def start(self, progress: Callable[[str], None] = lambda line: None) -> None:
        """Start every component and wait until all are ready. :raises DemoError: one did not come up."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.plugins = VendorPlugins.load(config=self.base_config.get("vendors") or {})
        for failure in self.plugins.failed:
            progress(f"vendor {failure.entry_point} ({failure.distribution}) not loaded: {failure.error}")
        from hami.webhook.certs import generate, write_bundle

        # One CA for the run: the API server's certificate (so kubectl sends the kubeconfig's token) and the webhook's.
        bundle = generate("hami-webhook", "kube-system", extra_names=["127.0.0.1", "localhost"], days=7)
        write_bundle(bundle, self.tls_dir)
        tls = (self.tls_dir / "tls.crt", self.tls_dir / "tls.key")
        self.api = ClusterApiServer(self.cluster, tls=tls, ca=self.ca_file).start()
        self.api.write_kubeconfig(self.kubeconfig, "hami-demo")
        self.node_metrics_port = free_port() if _loopback_aliases() else 0
        self._create_cluster_objects()
        self._start_scheduler()
        for line in self._unserved_kinds():
            progress(line)
        for node in self.inventory.nodes:
            self._start_node(node)
        self._wait_until_ready()

    def _unserved_kinds(self) -> list[str]:
        """A warning per inventory kind no loaded vendor serves, with the nearest served kind: a typo such as
        `kind: NVIDA` would otherwise only leave a node with no device (the node daemon's log says why)."""
        assert self.plugins is not None
        served = [kind.common_word for kind in self.plugins.kinds]
        found = []
        for node in self.inventory.nodes:
            for kind in dict.fromkeys(entry.kind for entry in node.devices):
                if kind in served:
                    continue
                near = nearest(kind, served)
                hint = f" (did you mean {near!r}?)" if near else ""
                found.append(
                    f"  warning: {self.inventory_path.name}: node {node.name} lists {kind} devices, but no loaded "
                    f"vendor serves that kind{hint}; served kinds: {', '.join(served) or 'none'}"
                )
        return found

    def _create_cluster_objects(self) -> None:
        for position, node in enumerate(self.inventory.nodes):
            allocatable = {k: v for k, v in (("cpu", node.cpu), ("memory", node.memory)) if v is not None}
            address = node_address(position) if self.node_metrics_port else "127.0.0.1"
            self.cluster.create(
                "nodes",
                {
                    "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name, **node.labels}},
                    "status": {
                        "capacity": dict(allocatable),
                        "allocatable": dict(allocatable),
                        "conditions": [{"type": "Ready", "status": "True"}],
                        "addresses": [
                            {"type": "InternalIP", "address": address},
                            {"type": "Hostname", "address": node.name},
                        ],
                    },
                },
            )
        for resource, obj in self.setup:
            self.cluster.create(resource, obj)  # type: ignore[arg-type]

    def _spawn(self, name: str, args: Sequence[str]) -> Child:
        path = self.workdir / "logs" / f"{name}.log"
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with path.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "hami.cli", "--log-level", self.log_level, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=environment,
                cwd=self.workdir,
            )
        child = Child(name, process, path)
        self.children.append(child)
        return child

    def _start_scheduler(self) -> None:
        self.scheduler_port, self.scheduler_metrics_port, self.webhook_port = free_port(), free_port(), free_port()
        self.dashboard_port = free_port()
        raw = _deep_merge(
            self.base_config,
            {
                "kubeconfig": str(self.kubeconfig),
                "scheduler": {
                    "listen": f"127.0.0.1:{self.scheduler_port}",
                    "metricsListen": f"127.0.0.1:{self.scheduler_metrics_port}",
                    "dashboardListen": f"127.0.0.1:{self.dashboard_port}",
                    **(
                        {"dashboardNodeMetrics": f"http://{{address}}:{self.node_metrics_port}/metrics"}
                        if self.node_metrics_port
                        else {}
                    ),
                },
                "webhook": {
                    "enabled": True,
                    "listen": f"127.0.0.1:{self.webhook_port}",
                    "tls": {"certFile": str(self.tls_dir / "tls.crt"), "keyFile": str(self.tls_dir / "tls.key")},
                },
            },
        )
        self._spawn("scheduler", ["scheduler", "--config", str(self._write_config("scheduler", raw))])

    def _start_node(self, node: SimulatedNode) -> None:
        assert self.plugins is not None
        kubelet = FakeKubelet().start()
        position = self.inventory.nodes.index(node)
        if self.node_metrics_port:
            side = NodeSide(node, kubelet, self.node_metrics_port, address=node_address(position))
        else:
            side = NodeSide(node, kubelet, free_port())
        self.nodes[node.name] = side
        for kind in dict.fromkeys(entry.kind for entry in node.devices):
            try:
                served = resources_of(self.plugins.kind(kind))
            except KeyError:
                continue  # no loaded vendor serves it: the daemon says so in its log
            for resource in served:
                side.resources[resource.name] = kind
        folder = self.workdir / "nodes" / node.name
        folder.mkdir(parents=True, exist_ok=True)
        raw = _deep_merge(self._config(node.name), {"kubeconfig": str(self.kubeconfig)})
        args = ["node", "--config", str(self._write_config(f"node-{node.name}", raw)), "--node-name", node.name]
        args += ["--simulated-inventory", str(self.inventory_path), "--device-plugin-dir", str(kubelet.directory)]
        args += ["--hook-dir", str(folder / "hami"), "--metrics-listen", f"{side.address}:{side.metrics_port}"]
        args += ["--discovery-interval", "2"]
        side.child = self._spawn(f"node-{node.name}", args)

    # ---------------------------------------------------------------------------------- waiting

    def check_children(self) -> None:
        """:raises DemoError: a component exited (with the end of its log)."""
        for child in self.children:
            status = child.process.poll()
            if status is not None:
                raise DemoError(f"{child.name} exited with status {status}; the end of {child.log}:\n{child.tail()}")

    def wait_for(self, what: str, check: Callable[[], object], timeout: float = READY_TIMEOUT_SECONDS) -> Any:
        """Poll `check()` until it answers something truthy, watching the children (a bound, not a timing)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_children()
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                logs = "\n".join(f"  {c.log}" for c in self.children)
                raise DemoError(f"{what} did not happen within {timeout:.0f} s; the components' logs:\n{logs}")
            time.sleep(0.05)

    def _get(self, url: str, path: str) -> tuple[int, str]:
        host_port = url.split("//", 1)[1]
        plugins, port = host_port.rsplit(":", 1)
        connection: http.client.HTTPConnection
        if url.startswith("https"):
            context = ssl.create_default_context(cafile=str(self.ca_file))
            connection = http.client.HTTPSConnection(plugins, int(port), timeout=5, context=context)
        else:
            connection = http.client.HTTPConnection(plugins, int(port), timeout=5)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException):
            return 0, ""
        finally:
            connection.close()

    def _node_published(self, side: NodeSide) -> bool:
        assert self.plugins is not None
        annotations = meta(self.cluster.get("nodes", side.node.name)).get("annotations") or {}
        for kind in set(side.resources.values()):
            key = self.plugins.kind(kind).annotations.node_register
            if key and key not in annotations:
                return False
        return all(side.kubelet.devices(resource) for resource in side.resources)

    def _scheduler_sees_devices(self) -> bool:
        status, text = self._get(f"http://127.0.0.1:{self.scheduler_metrics_port}", "/metrics")
        if status != 200:
            return False
        seen = sum(1 for line in text.splitlines() if line.startswith("hami_gpu_memory_limit_bytes{"))
        return seen >= self.expected_devices()

    def expected_devices(self) -> int:
        """Devices of kinds a loaded vendor serves, over every node of the inventory."""
        assert self.plugins is not None
        kinds = {k.common_word for k in self.plugins.kinds}
        return sum(entry.repeat for node in self.inventory.nodes for entry in node.devices if entry.kind in kinds)

    def _wait_until_ready(self) -> None:
        self.wait_for("the scheduler answering /readyz", lambda: self._get(self.scheduler_url, "/readyz")[0] == 200)
        self.wait_for("the webhook answering /readyz", lambda: self._get(self.webhook_url, "/readyz")[0] == 200)
        for side in self.nodes.values():
            self.wait_for(f"node {side.node.name} registering its devices", partial(self._node_published, side))
        self.wait_for("the scheduler seeing every device", self._scheduler_sees_devices)
        self.wait_for(
            "the scheduler's dashboard answering",
            lambda: self._get(f"http://127.0.0.1:{self.dashboard_port}", "/healthz")[0] == 200,
        )

    # ---------------------------------------------------------------------------------- stopping

    def stop(self) -> None:
        """SIGTERM to every child (SIGKILL after 10 s), then the kubelets and the API server."""
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for child in self.children:
            try:
                child.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop on SIGTERM; killing it", child.name)
                child.process.kill()
                child.process.wait(5)
        for side in self.nodes.values():
            side.kubelet.stop()
        if self.api is not None:
            self.api.stop()
            self.api = None

    def remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        return self.cluster.create(resource, obj)
