"""The node daemon assembled: settings, the event loop, the periodic work, and an orderly SIGTERM.

One asyncio event loop runs everything that waits: the device-plugin servers (`hami.node.plugin`), and
these periodic tasks:

* **discovery** (`discoveryIntervalSeconds`): every vendor's `hami_discover_devices`, in a worker thread (or,
  with `simulatedInventory`, the node's entry of that file instead: `hami.node.simulated`);
  the device lists of the plugins are updated (ListAndWatch pushes what changed), a plugin is created for a
  resource seen for the first time, and the node annotations are synced at once when anything changed;
* **kubelet** (`kubeletPollSeconds`): one `stat` of `kubelet.sock`; a new kubelet, or a plugin socket the
  kubelet removed, makes the affected plugins listen again and register again, without a restart;
* **node** (`registerIntervalSeconds`): the node lock's Lease made or adopted until it is in place
  (`hami.cluster.nodelease`, with `lockLease` and `$POD_NAMESPACE`), the register, handshake and lock-offer
  annotations compared and repaired (`hami.node.register`), and the served pods swept for `hami_release`
  (`hami.node.pods`);
* **backstop** (`backstop.intervalSeconds`, on unless `backstop.enabled` is false, off on simulated devices):
  the driver's per-process memory checked against each served container's grant (`hami.node.backstop`);
* **busy** (`busyPublishSeconds`, 30 s; 0 turns it off): each device's measured busy share written on the Node
  when it moved (`hami.node.busy`), for the scheduler's `usage` policy; for a vendor that gives a DRM source with
  engines, the share its engines' fdinfo times show between two publishes, as the backstop's rounds read them.

Blocking work (Kubernetes calls, vendor hooks, file copies) runs in worker threads; Allocate is serialized
per node by `hami.node.allocate`. The monitor serves metrics from its own thread.

At start-up the vendors' isolation libraries are installed (`hami.node.hooklib`), the pods already bound
to this node are listed once, and the heap left free by loading everything is returned to the OS (glibc's
`malloc_trim`, about 12 MB: the budget is 80 MB resident with every vendor loaded).

On SIGTERM or SIGINT: the plugins stop listening and end their streams, an Allocate in progress gets
`shutdownGraceSeconds` to finish (its annotation writes and lock release run to the end in their thread
either way), the sockets are removed, and the metrics server stops. Node annotations are left as they are:
the devices are still there, and the scheduler's handshake notices a daemon that does not come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hami.cluster.nodelease import DaemonLease
from hami.cluster.port import Cluster, ClusterError
from hami.config import HamiConfig, parse_address
from hami.dra.plugin import DraPlugin
from hami.dra.slices import SlicePublisher
from hami.errors import ConfigError
from hami.front import MetricsServer
from hami.model import DeviceReading, NodeInventory, Pod
from hami.node import simulated
from hami.node.allocate import Allocator
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.busy import BusyPublisher, measure_busy
from hami.node.devices import ResourceRole, advertised_devices, resources_of
from hami.node.drmusage import BusyWindow
from hami.node.hooklib import IsolationLibraries
from hami.node.journal import AllocationJournal
from hami.node.kubelet import KubeletSocket, RegistrationError
from hami.node.monitor import ContainerUsageReader, NodeMonitor
from hami.node.plugin import ResourcePlugin
from hami.node.pods import ServedPods, finished, node_of
from hami.node.preferred import PlacedPreference
from hami.node.register import NodeRegistrar
from hami.node.usage import AccountingReader
from hami.plugins import VendorPlugins
from hami.signing import KEYS_ENVIRONMENT, PlacementKeys

__all__ = ["NodeDaemon", "NodeSettings", "connect", "run_node"]

log = logging.getLogger(__name__)


class NodeSettings(BaseModel):
    """How the node daemon runs; the shape of a future `node` section of the configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    node_name: str = Field(min_length=1, alias="nodeName", description="this node's name (the downward API's)")
    device_plugin_dir: Path = Field(default=Path("/var/lib/kubelet/device-plugins"), alias="devicePluginDir")
    hook_dir: Path = Field(default=Path("/usr/local/hami"), alias="hookDir")
    metrics_listen: str = Field(default="0.0.0.0:9394", alias="metricsListen")
    discovery_interval_seconds: float = Field(default=10.0, gt=0, alias="discoveryIntervalSeconds")
    register_interval_seconds: float = Field(default=30.0, gt=0, alias="registerIntervalSeconds")
    kubelet_poll_seconds: float = Field(default=0.5, gt=0, alias="kubeletPollSeconds")
    shutdown_grace_seconds: float = Field(default=5.0, ge=0, alias="shutdownGraceSeconds")
    lock_lease: bool = Field(
        default=True,
        alias="lockLease",
        description="offer the scheduler a Lease for the node lock (hami.cluster.nodelease: no Node write per pod) "
        "when the daemon knows its namespace ($POD_NAMESPACE, and $POD_NAME, $POD_UID to own it, from the downward "
        "API); false, or no namespace: the node annotation lock only, as HAMi's daemon",
    )
    simulated_inventory: Path | None = Field(
        default=None,
        alias="simulatedInventory",
        description="an inventory file to read devices from instead of the vendors' discovery (hami.node.simulated)",
    )

    dra_driver: str | None = Field(
        default=None,
        alias="draDriver",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$",
        description="publish the node's devices as DRA ResourceSlices under this driver name (e.g. `hami.io`) and "
        "serve its kubelet plugin (hami.dra); unset: the device-plugin path only",
    )
    dra_plugin_dir: Path = Field(default=Path("/var/lib/kubelet/plugins"), alias="draPluginDir")
    plugin_registry_dir: Path = Field(default=Path("/var/lib/kubelet/plugins_registry"), alias="pluginRegistryDir")
    cdi_dir: Path = Field(default=Path("/var/run/cdi"), alias="cdiDir", description="where the CDI spec files go")
    busy_publish_seconds: float = Field(
        default=30.0,
        ge=0,
        alias="busyPublishSeconds",
        description="how often each device's measured busy share is considered for the Node's "
        "hami.io/node-device-busy annotation, which the scheduler's `usage` policy reads (hami.node.busy); 0: never",
    )
    backstop: BackstopSettings = Field(
        default_factory=BackstopSettings,
        description="the driver's per-process memory checked against each container's grant (hami.node.backstop)",
    )

    @field_validator("metrics_listen")
    @classmethod
    def _address(cls, value: str) -> str:
        parse_address(value)
        return value


class NodeDaemon:
    """Every part of the node daemon, and the loop that drives them."""

    def __init__(
        self,
        settings: NodeSettings,
        plugins: VendorPlugins,
        cluster: Cluster,
        *,
        container_usage: ContainerUsageReader | None = None,
        placement_keys: PlacementKeys | None = None,
        lease: DaemonLease | None = None,
    ) -> None:
        self.settings = settings
        self.plugins = plugins
        self.cluster = cluster
        self.node = settings.node_name
        self.kubelet = KubeletSocket(settings.device_plugin_dir)
        self.libraries = IsolationLibraries(settings.hook_dir)
        self.served = ServedPods(plugins)
        self.placement_keys = placement_keys if placement_keys is not None else PlacementKeys.from_environment()
        self.allocator = Allocator(
            cluster,
            plugins,
            self.node,
            on_served=self.served.record,
            library_of=self.libraries.for_vendor,
            placement_keys=self.placement_keys,
            journal=AllocationJournal(settings.hook_dir / "allocate-journal"),
            lease=lease,
        )
        self.lease = lease
        self.preference = PlacedPreference(self.allocator.pending_placements)
        """GetPreferredAllocation for pods that ask ``hami.io/numa-alignment``."""
        if self.placement_keys is None:
            log.warning(
                "placement verification is OFF (%s unset): Allocate serves whatever devices a pod's annotations "
                "name, as HAMi does; anyone allowed to patch pods on node %s can ask for any of its devices",
                KEYS_ENVIRONMENT,
                self.node,
            )
        else:
            log.info(
                "placement verification on: serving only placements signed with the keys in %s",
                self.placement_keys.source,
            )
        self.registrar = NodeRegistrar(
            cluster,
            plugins,
            self.node,
            lock_lease=lambda: self.lease.annotation if self.lease is not None and self.lease.in_place else None,
        )
        self.container_usage = container_usage or AccountingReader(self.served.containers)
        self.monitor = NodeMonitor(
            self.node,
            lambda: self.inventories,
            self.served.containers,
            container_usage=self.container_usage,
            device_usage=self._device_readings,
        )
        self.busy = BusyPublisher(
            cluster,
            self.node,
            lambda: measure_busy(self.inventories, self._device_readings(), self.container_usage(), self._drm_busy()),
        )
        self.backstop: Backstop | None = None
        self._drm_window: BusyWindow | None = None
        if settings.backstop.enabled and settings.simulated_inventory is None:  # simulated devices run nothing
            self.backstop = Backstop(
                plugins,
                cluster,
                self.served.containers,
                settings.backstop,
                devices=lambda: {d.id for inventory in self.inventories.values() for d in inventory.devices},
            )
            self.monitor.registry.register(self.backstop)
            self._drm_window = BusyWindow(self.backstop.drm)
        self.inventories: dict[str, NodeInventory] = {}
        self.resource_plugins: dict[str, ResourcePlugin] = {}
        self.metrics: MetricsServer | None = None
        self.discoveries = 0
        """Discovery rounds completed."""
        self._registered: set[str] = set()
        self._failures: dict[str, str] = {}
        self._kubelet: tuple[int, int] | None = None
        self._node_lock = asyncio.Lock()
        self._kubelet_lock = asyncio.Lock()
        self.slices: SlicePublisher | None = None
        """The node's DRA ResourceSlice (`draDriver` set), kept equal to the inventories at every node sync."""
        self.dra: DraPlugin | None = None
        """The DRA kubelet plugin (`draDriver` set)."""
        if settings.dra_driver:
            slices = self.slices = SlicePublisher(cluster, plugins, self.node, settings.dra_driver)
            self.dra = DraPlugin(
                cluster, plugins, self.node, settings.dra_driver, lambda: slices.devices,
                plugin_dir=settings.dra_plugin_dir, registry_dir=settings.plugin_registry_dir,
                cdi_dir=settings.cdi_dir, library_of=self.libraries.for_vendor, placement_keys=self.placement_keys,
                served=lambda: [
                    (f"pod {c.namespace}/{c.pod}", c.pod_uid, c.devices) for c in self.served.containers()
                ],
            )  # fmt: skip

    # ---------------------------------------------------------------------------------- running

    async def serve(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set, then shut down."""
        address = parse_address(self.settings.metrics_listen)
        try:
            self.metrics = self.monitor.serve(address)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {self.settings.metrics_listen}: {exc.strerror}") from None
        tasks: list[asyncio.Task[None]] = []
        try:
            await asyncio.to_thread(self._start_up)
            log.info(
                "node daemon for %s: vendors %s; device plugins in %s; metrics on port %d",
                self.node, ", ".join(v.name for v in self.plugins.vendors) or "none",
                self.settings.device_plugin_dir, self.metrics.port,
            )  # fmt: skip
            await self.discover()
            await self.check_kubelet()
            _return_free_memory()
            s = self.settings
            tasks = [
                asyncio.create_task(self._every(s.discovery_interval_seconds, self.discover), name="discovery"),
                asyncio.create_task(self._every(s.kubelet_poll_seconds, self.check_kubelet), name="kubelet"),
                asyncio.create_task(self._every(s.register_interval_seconds, self.node_work), name="node"),
            ]
            if self.backstop is not None:
                every = s.backstop.interval_seconds
                tasks.append(asyncio.create_task(self._every(every, self.check_backstop), name="backstop"))
            if s.busy_publish_seconds:
                tasks.append(asyncio.create_task(self._every(s.busy_publish_seconds, self.publish_busy), name="busy"))
            await stop.wait()
        finally:
            log.info("node daemon shutting down")
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.shutdown()

    async def shutdown(self) -> None:
        """Stop every plugin (in-flight calls get the grace period), remove the sockets, stop the metrics."""
        grace = self.settings.shutdown_grace_seconds
        await asyncio.gather(*(p.stop(grace) for p in self.resource_plugins.values()), return_exceptions=True)
        if self.dra is not None:
            await self.dra.stop(grace)
        self._registered.clear()
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None

    def _drm_busy(self) -> dict[str, float]:
        """The devices' busy shares from DRM fdinfo since the last publish (the backstop's rounds count them)."""
        return {} if self._drm_window is None else self._drm_window.shares()

    async def publish_busy(self) -> None:
        """One round of publishing the devices' busy shares on the Node (hami.node.busy)."""
        await asyncio.to_thread(self.busy.publish)

    async def check_backstop(self) -> None:
        """One round of the node-side backstop (hami.node.backstop)."""
        if self.backstop is not None:
            await asyncio.to_thread(self.backstop.check)

    @staticmethod
    async def _every(seconds: float, work: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(seconds)
            try:
                await work()
            except Exception:  # periodic work goes on after a failure
                log.exception("periodic %s failed", getattr(work, "__name__", "work"))

    def _device_readings(self) -> list[DeviceReading]:
        """Each vendor's readings of its devices here (`hami_device_readings`), for the monitor's scrape; on
        simulated devices, the inventory's `reading`s."""
        if self.settings.simulated_inventory is not None:
            return simulated.readings(self.settings.simulated_inventory, self.node)
        found: list[DeviceReading] = []
        for kind in list(self.inventories):
            try:
                found += self.plugins.device_readings(kind) or ()
            except Exception:  # one vendor's failure leaves its devices unknown, not the scrape failed
                log.exception("reading the %s devices' figures failed", kind)
        return found

    def _start_up(self) -> None:
        for vendor in self.plugins.vendors:
            try:
                self.libraries.install(vendor)
            except OSError as exc:
                log.error("cannot install the isolation library of vendor %s: %s", vendor.name, exc)
        try:
            pods, _ = self.cluster.list("pods")
            found = self.served.load(pods, self.node)
            if found:
                log.info("node %s already serves %d container(s)", self.node, found)
        except ClusterError as exc:
            log.warning("cannot list the pods already on node %s (%s); metrics start with none", self.node, exc)
            return
        here = [Pod.from_api(p) for p in pods if node_of(p) == self.node and not finished(p)]
        for kind in self.plugins.kinds:
            try:
                self.plugins.reconcile(kind.common_word, here)
            except Exception:  # one vendor's clean-up must not stop the daemon
                log.exception("reconciling the %s devices of node %s failed", kind.common_word, self.node)

    # ---------------------------------------------------------------------------------- discovery

    def find_devices(self) -> dict[str, list[NodeInventory]] | None:
        """Every vendor's devices on this node, by vendor: their discovery hooks, or the simulated inventory
        file when one is set (None when that file cannot be used this round: the last inventory stays)."""
        path = self.settings.simulated_inventory
        if path is None:
            return self.plugins.discover()
        try:
            return simulated.discover(path, self.node, self.plugins)
        except ConfigError as exc:
            log.error("%s; keeping the devices found before", exc)
            return None

    async def discover(self) -> None:
        """Ask every vendor for its devices; update plugins, and the node annotations if anything changed."""
        found = await asyncio.to_thread(self.find_devices)
        if found is None:
            self.discoveries += 1
            return
        inventories: dict[str, NodeInventory] = {}
        for vendor, answers in found.items():
            for inventory in answers:
                try:
                    owner = self.plugins.owner(inventory.kind).name
                except KeyError:
                    owner = None
                if owner != vendor:
                    log.warning("vendor %s reported devices of kind %r, which it does not own", vendor, inventory.kind)
                    continue
                inventories[inventory.kind] = inventory
        for word in self.inventories:
            inventories.setdefault(word, NodeInventory(kind=word))  # vanished devices: publish none, not stale
        changed = inventories != self.inventories
        self.inventories = inventories
        created = False
        for word, inventory in sorted(inventories.items()):
            kind = self.plugins.kind(word)
            for resource in resources_of(kind):
                plugin = self.resource_plugins.get(resource.name)
                if plugin is None:
                    plugin = ResourcePlugin(
                        resource, self.settings.device_plugin_dir, self.allocator.allocate, self.preference
                    )
                    self.resource_plugins[resource.name] = plugin
                    created = True
                devices = advertised_devices(kind, resource.role, inventory.devices)
                if await plugin.set_devices(devices) and plugin.serving:
                    healthy = sum(d.healthy for d in devices)
                    log.info("%s: %d device(s), %d healthy", resource.name, len(devices), healthy)
        if created:
            await self.check_kubelet()
        if changed:
            await self.node_work(sweep=False)
        self.discoveries += 1

    # ---------------------------------------------------------------------------------- kubelet

    async def check_kubelet(self) -> None:
        """Listen again and register again wherever the kubelet lost track of a plugin."""
        async with self._kubelet_lock:
            await self._check_kubelet()

    async def _check_kubelet(self) -> None:
        if self.dra is not None:
            try:
                await self.dra.ensure_listening()
            except (OSError, RuntimeError) as exc:
                log.error("cannot serve DRA driver %s (%s); trying again", self.dra.driver, exc)
        identity = self.kubelet.identity()
        if identity is None:
            if self._kubelet is not None:
                log.warning("%s is gone: waiting for the kubelet to come back", self.kubelet.path)
                self._kubelet = None
            self._registered.clear()
            return
        if identity != self._kubelet:
            if self._kubelet is not None:
                log.info("the kubelet restarted: registering again")
            self._kubelet = identity
            self._registered.clear()
        for name, plugin in sorted(self.resource_plugins.items()):
            if not plugin.socket_present:
                if plugin.serving:
                    log.info("the socket of %s was removed: listening again", name)
                    await plugin.stop(grace=0)
                self._registered.discard(name)
                try:
                    await plugin.start()
                except (OSError, RuntimeError) as exc:  # grpc says RuntimeError when it cannot bind
                    log.error("cannot listen on %s for %s (%s); trying again", plugin.socket_path, name, exc)
                    continue
            if name in self._registered:
                continue
            try:
                await self.kubelet.register(plugin.socket_path.name, name, plugin.options())
            except RegistrationError as exc:
                if self._failures.get(name) != str(exc):  # said once, not at every poll
                    log.warning("%s; trying again every %s s", exc, self.settings.kubelet_poll_seconds)
                self._failures[name] = str(exc)
                continue
            self._failures.pop(name, None)
            self._registered.add(name)
            role = "" if plugin.resource.role == ResourceRole.COUNT else f" ({plugin.resource.role})"
            log.info("registered %s%s with the kubelet", name, role)

    # ---------------------------------------------------------------------------------- node

    async def node_work(self, sweep: bool = True) -> None:
        """Sync the register and handshake annotations; with `sweep`, release finished pods too."""
        async with self._node_lock:
            await asyncio.to_thread(self._node_work, sweep)

    def _node_work(self, sweep: bool) -> None:
        if self.lease is not None and not self.lease.in_place:
            self.lease.ensure()  # once in place, an Allocate finding it gone creates it again (`DaemonLease.holder`)
        if self.inventories:
            try:
                self.registrar.sync(self.inventories)
            except ClusterError as exc:
                log.warning("cannot update node %s's annotations (%s); trying again", self.node, exc)
        if self.slices is not None:
            try:
                self.slices.sync(self.inventories)
            except ClusterError as exc:
                log.warning("cannot publish node %s's ResourceSlice (%s); trying again", self.node, exc)
        if sweep:
            for name in self.served.sweep(self.cluster):
                log.info("pod %s finished: its devices are released", name)


def _return_free_memory() -> None:
    """Hand the heap left free by start-up (imports, plugin loading) back to the OS: about 12 MB resident.

    glibc keeps freed memory in its arenas; `malloc_trim` releases it. Elsewhere this does nothing.
    """
    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


def connect(config: HamiConfig) -> Cluster:
    """The real cluster: the kubeconfig named in the configuration, or the in-cluster service account."""
    from hami.cluster.kube import KubeCluster

    if config.kubeconfig:
        return KubeCluster.from_kubeconfig(config.kubeconfig, component="hami-node")
    return KubeCluster.in_cluster(component="hami-node")


def _lock_lease(settings: NodeSettings, cluster: Cluster) -> DaemonLease | None:
    """The node lock's Lease when `lockLease` is on and the downward API gives the daemon's namespace."""
    namespace = os.environ.get("POD_NAMESPACE", "")
    if not settings.lock_lease or not namespace:
        log.info("node %s: the node annotation lock only (no $POD_NAMESPACE, or lockLease false)", settings.node_name)
        return None
    if not DaemonLease.usable(settings.node_name, namespace):
        log.warning(
            "node %s: no Lease can be named for this node in %r: annotation lock", settings.node_name, namespace
        )
        return None
    pod_name, pod_uid = os.environ.get("POD_NAME", ""), os.environ.get("POD_UID", "")
    if not (pod_name and pod_uid):
        log.warning(
            "node %s: $POD_NAME/$POD_UID unset: the node lock's Lease is not owned by this daemon's Pod, so it "
            "outlives the daemon (set them from the downward API)",
            settings.node_name,
        )
    return DaemonLease(cluster, settings.node_name, namespace, pod_name=pod_name, pod_uid=pod_uid)


def run_node(
    config: HamiConfig,
    settings: NodeSettings,
    *,
    cluster: Cluster | None = None,
    plugins: VendorPlugins | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT (or `stop` is set, from another thread); returns the exit status."""
    plugins = plugins or VendorPlugins.load(config=config.vendors)
    for failure in plugins.failed:
        log.error("vendor %s (%s) not loaded: %s", failure.entry_point, failure.distribution, failure.error)
    if settings.simulated_inventory is not None:
        inventory = settings.simulated_inventory
        simulated.load_inventory(inventory).node(settings.node_name, str(inventory))  # a bad file stops us here
        log.info("devices of node %s come from %s, not from the vendors' drivers", settings.node_name, inventory)
    cluster = cluster or connect(config)
    daemon = NodeDaemon(settings, plugins, cluster, lease=_lock_lease(settings, cluster))

    async def main() -> None:
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
                loop.add_signal_handler(sig, done.set)
        if stop is not None:
            threading.Thread(
                target=lambda: (stop.wait(), loop.call_soon_threadsafe(done.set)), daemon=True, name="node-stop"
            ).start()
        await daemon.serve(done)

    asyncio.run(main())
    close = getattr(cluster, "close", None)
    if callable(close):
        close()
    log.info("node daemon stopped")
    return 0
