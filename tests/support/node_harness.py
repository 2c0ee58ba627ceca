"""Running the node daemon for tests: in a thread (in-process) or as its own process, and acting as the scheduler.

* `DaemonThread` runs `NodeDaemon` on its own event loop in a thread, against any `Cluster` (usually a
  `MemoryCluster`) and a `VendorPlugins` given directly: fast, and the test can look inside.
* `DaemonProcess` runs the real command, `python -m hami.node ...`, against the fake API server (so the
  daemon uses `KubeCluster` for real) with the scripted vendor installed as `hami_vendor_scripted`: a
  package plus a `.dist-info` with its `hami.vendors` entry point on the process's `PYTHONPATH`, which is
  exactly how an installed vendor is found.
* `place_pod` writes what the scheduler's filter and bind leave behind: the to-allocate and allocated
  annotations, `bind-phase: allocating`, the chosen node, and (unless told not to) the node lock with the
  pod's UID.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from hami.cluster import Cluster, meta
from hami.cluster.locks import LOCK_ANNOTATION
from hami.cluster.nodelease import DaemonLease
from hami.codec import NodeLock, encode_node_lock, encode_pod_devices
from hami.model import ContainerDevice
from hami.node.daemon import NodeDaemon, NodeSettings
from hami.plugins import VendorPlugins
from hami.scheduler.extender import BIND_PHASE

SUPPORT = Path(__file__).parent
ROOT = SUPPORT.parent.parent
NODE = "node-a"
"""The node the daemon serves in these tests."""


def write_script(path: Path, devices: Mapping[str, Sequence[Mapping[str, Any]]], **extra: Any) -> Path:
    """The scripted vendor's script: devices per kind, plus `refuse`, `refuse_allocate`, `edits_delay`."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"devices": devices, **extra}))
    tmp.replace(path)  # the daemon never reads half a file
    return path


def scripted_devices(n: int = 2, prefix: str = "SCR", count: int = 4, devmem: int = 8192) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}-{i}", "index": i, "count": count, "devmem": devmem, "numa": i % 2} for i in range(n)]


def build_library(directory: Path, name: str = "libscripted.so", marker: str = "v1") -> Path:
    """A real (dummy) shared library compiled by the test; skips the test without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the dummy isolation library")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / f"{name}.c"
    source.write_text(f'const char *hami_dummy_isolation(void) {{ return "{marker}"; }}\n')
    out = directory / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(source)], check=True, capture_output=True)
    return out


def install_scripted_vendor(site: Path, library: Path | None = None, version: str = "0.1.0") -> Path:
    """Install the scripted vendor into `site` as `hami_vendor_scripted` (entry point `scripted`)."""
    package = site / "hami_vendor_scripted"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SUPPORT / "scripted_vendor.py", package / "__init__.py")
    if library is not None:
        shutil.copyfile(library, package / "libscripted.so")
    info = site / f"hami_vendor_scripted-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hami-vendor-scripted\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[hami.vendors]\nscripted = hami_vendor_scripted\n")
    return site


def place_pod(
    cluster: Cluster,
    node: str,
    name: str,
    placements: Mapping[str, Sequence[Sequence[ContainerDevice]]],
    *,
    init: int = 0,
    sidecars: Collection[int] = (),
    namespace: str = "default",
    lock: bool = True,
    phase: str = "Pending",
) -> dict[str, Any]:
    """Create a pod as the scheduler leaves it after filter and bind; placements are per kind, init first.
    `sidecars` are the positions of the init containers that are native sidecars (`restartPolicy: Always`)."""
    total = max(len(p) for p in placements.values())
    names = [f"init{i}" for i in range(init)] + [f"c{i}" for i in range(total - init)]
    containers: list[dict[str, Any]] = [{"name": n, "image": "busybox"} for n in names]
    for i in sidecars:
        containers[i]["restartPolicy"] = "Always"
    annotations = {BIND_PHASE: "allocating", "hami.io/vgpu-node": node, "hami.io/bind-time": str(int(time.time()))}
    for kind, entries in placements.items():
        word = kind.lower()
        value = encode_pod_devices([tuple(e) for e in entries])
        annotations[f"hami.io/{word}-devices-to-allocate"] = value
        annotations[f"hami.io/{word}-devices-allocated"] = value
    obj = cluster.create(
        "pods",
        {
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"nodeName": node, "initContainers": containers[:init], "containers": containers[init:]},
            "status": {"phase": phase},
        },
    )
    if lock:
        lock_node(cluster, node, namespace, name, meta(obj)["uid"])
    return obj


def lock_node(cluster: Cluster, node: str, namespace: str, name: str, uid: str) -> None:
    value = encode_node_lock(NodeLock(datetime.now(UTC), namespace, name, uid))
    cluster.patch_metadata("nodes", node, annotations={LOCK_ANNOTATION: value})


def dev(uuid: str, mem: int = 1000, cores: int = 10, kind: str = "Scripted") -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type=kind, usedmem=mem, usedcores=cores)


def pod_annotations(cluster: Cluster, name: str, namespace: str = "default") -> dict[str, str]:
    return dict(meta(cluster.get("pods", name, namespace)).get("annotations") or {})


def node_annotations(cluster: Cluster, node: str) -> dict[str, str]:
    return dict(meta(cluster.get("nodes", node)).get("annotations") or {})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def eventually(check: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll `check()` until it returns something truthy (not a timing assertion: a bound on waiting)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout} s")
        time.sleep(0.02)


class DaemonThread:
    """`NodeDaemon` on its own event loop in a thread."""

    def __init__(
        self, settings: NodeSettings, plugins: VendorPlugins, cluster: Cluster, lease: DaemonLease | None = None
    ) -> None:
        self.daemon = NodeDaemon(settings, plugins, cluster, lease=lease)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="node-daemon", daemon=True)

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await self.daemon.serve(self._stop)

        try:
            asyncio.run(main())
        except BaseException as exc:  # surfaced by stop()
            self._error = exc
            self._ready.set()

    def start(self) -> DaemonThread:
        self._thread.start()
        self._ready.wait(10)
        return self

    def call(self, coroutine: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the daemon's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        if self._error is not None:
            raise self._error


class DaemonProcess:
    """`python -m hami.node` as a child process; its log goes to `log_path`."""

    def __init__(self, args: Sequence[str], site: Path, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join([str(site), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        environment.update(env or {})
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hami.node", *args], env=environment, stdout=self._log, stderr=subprocess.STDOUT
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._log.close()
