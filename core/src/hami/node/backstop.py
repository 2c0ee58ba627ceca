"""The node-side backstop: what each container really holds on its devices, by the driver's count, against its grant.

The isolation libraries hold limits inside a container's processes, where a process that never loads them (a static
binary, raw calls on the device node) or that patches its own memory escapes them. The driver's count per process
cannot be changed from inside a container, so at each round the daemon

1. asks each vendor serving a container here for its devices' processes (`hami_device_processes`: PID and device
   memory, the context's reservation included, as the driver counts it); for a vendor whose library has no such
   call but whose kernel driver publishes DRM client statistics (`hami_drm_usage_source`), reads them instead from
   the fdinfo of the served pods' processes, found by their cgroup (`hami.node.drmusage`: each DRM client counted
   once per container), which also gives each device's engine busy time for the Node's busy share;
2. maps each process to the container it runs in through the kernel's record, `/proc/<pid>/cgroup`: the pod UID
   the kubelet puts in the cgroup path (`...pod<uid>...`), then, when several containers of the pod hold the same
   device, the container id at the end of the path matched with the pod's `status.containerStatuses` (one GET).
   A container cannot move itself out of its cgroup (the cgroup tree is read-only in it), and a process this
   daemon did not serve (a host process, another device plugin's pod) is none of its business;
3. sums each container's processes per device and compares the sum with the memory the container was granted on
   that device (the scheduler's placement, as `hami_vgpu_memory_limit_bytes` reports it). Over it, the daemon
   records a Warning event `DeviceMemoryOverLimit` on the pod, counts it in `hami_backstop_overruns_total` and,
   unless `backstop.kill` is false, kills (SIGKILL) the container's processes on that device. A process whose
   container cannot be told apart is checked with its pod's total against the pod's total grant, and not killed.

`hami_backstop_device_memory_bytes` exports the driver's figure for every served container and device. The round
runs every `backstop.intervalSeconds` (default 1 s: a container over its grant is killed within about a second; a
round on a node of 8 devices and 64 containers takes 4-5 ms of CPU, 0.5 % of a core, benchmarks/backstop.py) in the
daemon's worker thread; 18-23 ms where the processes come from DRM fdinfo, 64 descriptors each, beside 300 host
processes). What it does not see: memory neither a vendor's library nor its driver's fdinfo reports per process,
and a container over its limit for less than one round. What it
judges only where the placement can be read: a process on a device its pod was not given is held to a grant
of 0, but only when every device the pod's placements name is one discovery reports here (`devices`). HAMi's own
scheduler names Cambricon's and MetaX's whole cards by capacity (``<node>-cambricon-mlu-<i>``,
``<node>-metax-<i>``), which matches no device id: such a pod's processes are not judged (logged once), rather
than killed for using the cards they were given under another name.

The round also tells each container's isolation library its processes' host pids, which a management library
names processes by (NVML's per-process utilization) and which a process in the container's pid namespace cannot
learn: for every process it mapped to a container that has a grant directory, the daemon reads the pid in the
process's innermost pid namespace (the last field of ``NSpid:`` in the host's ``/proc/<pid>/status``) and that
namespace (``/proc/<pid>/ns/pid``), and writes ``<grant dir>/pids`` (GRANT.md) whole when it changed. The grant
directory is read-only in the container, so a tenant cannot name another process's host pid as its own.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel, ConfigDict, Field

from hami.cluster.port import Cluster, ClusterError
from hami.isolation.accounting import AccountingFileError, read_tampered
from hami.isolation.grant import render_pid_map, write_pid_map
from hami.model import DeviceProcess, DrmUsageSource
from hami.node.drmusage import DrmUsage
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins

__all__ = ["Backstop", "BackstopSettings", "Overrun", "namespace_pid", "owner_of", "pod_processes"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"(?:^|[-/])([0-9a-f]{64})(?:\.scope)?$")
_LABELS = ["namespace", "pod", "container", "device_uuid"]
_PID_NAMESPACE = re.compile(r"pid:\[([0-9]+)\]")


class BackstopSettings(BaseModel):
    """`node.backstop` in the configuration file."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    enabled: bool = True
    kill: bool = Field(default=True, description="kill a container's processes on a device it holds too much of")
    interval_seconds: float = Field(default=1.0, gt=0, alias="intervalSeconds")
    proc_root: Path = Field(default=Path("/proc"), alias="procRoot", description="the host's /proc")


def owner_of(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, str] | None:
    """(pod UID, container id or "") of a process, from its cgroup path; None when it is in no pod's cgroup."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text()
    except OSError:
        return None  # gone already, or not visible from here
    return _owner(text)


def _owner(text: str) -> tuple[str, str] | None:
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        found = _POD_UID.search(path)
        if found:
            container = _CONTAINER_ID.search(path.rstrip("/"))
            return found.group(1).replace("_", "-"), container.group(1) if container else ""
    return None


def pod_processes(proc_root: Path, pods: set[str]) -> dict[int, tuple[str, str]]:
    """Host pid → (pod UID, container id) of every process of `pods` under `proc_root`, from each process's cgroup
    (`owner_of`): the processes whose DRM clients the backstop reads, found whatever device they use."""
    found: dict[int, tuple[str, str]] = {}
    if not pods:
        return found
    try:
        root = os.open(proc_root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return found
    try:
        for name in os.listdir(root):
            if not name.isdigit():
                continue
            try:
                record = os.open(f"{name}/cgroup", os.O_RDONLY, dir_fd=root)
            except OSError:
                continue  # gone already, or not visible from here
            try:
                text = os.read(record, 65536).decode("utf-8", "replace")
            except OSError:
                continue
            finally:
                os.close(record)
            owner = _owner(text) if "pod" in text else None
            if owner is not None and owner[0] in pods:
                found[int(name)] = owner
    finally:
        os.close(root)
    return found


def namespace_pid(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, int] | None:
    """(pid in its innermost pid namespace, that namespace's inode) of host process `pid`, from ``NSpid:`` in its
    status and its ``ns/pid`` link; None when it is gone or either cannot be read."""
    base = proc_root / str(pid)
    try:
        status = (base / "status").read_text()
        link = os.readlink(base / "ns" / "pid")
    except OSError:
        return None
    found = _PID_NAMESPACE.fullmatch(link)
    fields = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    if found is None or not fields or not fields[-1].isdigit() or fields[0] != str(pid):
        return None  # a kernel before 4.1 (no NSpid), or not this process's record
    return int(fields[-1]), int(found.group(1))


@dataclass(frozen=True)
class Overrun:
    """A container holding more device memory than it was granted."""

    container: ServedContainer
    device_uuid: str
    used_bytes: int
    limit_bytes: int
    pids: tuple[int, ...]
    killed: bool


@dataclass
class _Holding:
    used: int = 0
    pids: list[int] = field(default_factory=list)


class Backstop(Collector):
    """One node's backstop. `check()` runs one round; as a Collector it exports the backstop's families."""

    def __init__(
        self,
        plugins: VendorPlugins,
        cluster: Cluster,
        containers: Callable[[], Iterable[ServedContainer]],
        settings: BackstopSettings | None = None,
        *,
        kill: Callable[[int], None] | None = None,
        devices: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        self.plugins = plugins
        self.devices = devices
        """The ids of the devices discovery reports on this node; None: every placement is taken as readable."""
        self._unreadable: set[str] = set()
        self.cluster = cluster
        self.containers = containers
        self.settings = settings or BackstopSettings()
        self._kill = kill or (lambda pid: os.kill(pid, signal.SIGKILL))
        self.overruns: dict[tuple[str, str, str, str], int] = {}
        """(namespace, pod, container, device) → overruns found."""
        self.used: dict[tuple[str, str, str, str], int] = {}
        """(namespace, pod, container, device) → device memory the driver counted at the last round."""
        self.pid_maps: dict[str, str] = {}
        """Grant directory → the ``pids`` text last written there."""
        self.tampered: dict[tuple[str, int], int] = {}
        """(accounting file, device index) → the file's ``tampered`` count at the last round."""
        self.drm = DrmUsage(self.settings.proc_root)
        """The served containers' DRM clients, for the kinds whose vendor gives a DRM source."""

    # ---------------------------------------------------------------------------------- one round

    def check(self) -> list[Overrun]:
        """Read every served container's processes, report and (by default) stop each one over its grant."""
        served = list(self.containers())
        by_pod: dict[str, list[ServedContainer]] = {}
        for c in served:
            by_pod.setdefault(c.pod_uid, []).append(c)
        owners: dict[int, tuple[str, str]] = {}
        processes = self._processes({c.kind for c in served}, set(by_pod), owners)
        known = set(self.devices()) if self.devices is not None else None
        holdings: dict[tuple[str, str, str], _Holding] = {}
        chosen_of: dict[tuple[str, str, str], ServedContainer] = {}
        pod_level: dict[tuple[str, str], _Holding] = {}
        for process in processes:
            owner = owners[process.pid] if process.pid in owners else owner_of(process.pid, self.settings.proc_root)
            if owner is None or owner[0] not in by_pod:
                continue
            pod_uid, container_id = owner
            candidates = [c for c in by_pod[pod_uid] if any(d.uuid == process.device_uuid for d in c.devices)]
            if not candidates:
                named = {d.uuid for c in by_pod[pod_uid] for d in c.devices}
                if known is not None and not named <= known:
                    self._cannot_read(by_pod[pod_uid][0], named - known)
                    continue
                candidates = by_pod[pod_uid]  # on a device the pod was not given: its containers' business still
            chosen = candidates[0] if len(candidates) == 1 else self._by_container_id(candidates, container_id)
            if chosen is None:
                held = pod_level.setdefault((pod_uid, process.device_uuid), _Holding())
            else:
                key = (chosen.pod_uid, chosen.container, process.device_uuid)
                chosen_of[key] = chosen
                held = holdings.setdefault(key, _Holding())
            held.used += process.used_bytes
            held.pids.append(process.pid)
        self.used = {_key(chosen_of[k], k[2]): h.used for k, h in holdings.items()}
        self._publish_pids(served, holdings, chosen_of)
        self._tampering(served)
        found = [self._judge(chosen_of[k], k[2], h) for k, h in holdings.items()]
        for (pod_uid, uuid), h in pod_level.items():
            found.append(self._judge_pod(by_pod[pod_uid], uuid, h))
        return [o for o in found if o is not None]

    def _publish_pids(
        self,
        served: Sequence[ServedContainer],
        holdings: dict[tuple[str, str, str], _Holding],
        chosen_of: dict[tuple[str, str, str], ServedContainer],
    ) -> None:
        """Write each served container's ``pids`` where it changed, and once at the first round that sees it: what a
        daemon before a restart left there may list processes that have ended since."""
        entries: dict[str, set[tuple[int, int, int]]] = {c.grant_dir: set() for c in served if c.grant_dir}
        for key, held in holdings.items():
            directory = chosen_of[key].grant_dir
            if not directory:
                continue
            for pid in held.pids:
                inner = namespace_pid(pid, self.settings.proc_root)
                if inner is not None:
                    entries[directory].add((inner[0], pid, inner[1]))
        self.pid_maps = {d: t for d, t in self.pid_maps.items() if d in entries}  # forget released containers
        for directory, found in entries.items():
            text = render_pid_map(sorted(found))
            if self.pid_maps.get(directory) == text:  # a directory not written yet (a restart) is written
                continue
            try:
                write_pid_map(directory, text)
            except OSError as exc:
                log.warning("cannot write the pid map of grant directory %s: %s", directory, exc)
                continue
            self.pid_maps[directory] = text

    def _tampering(self, served: Sequence[ServedContainer]) -> None:
        """Record a Warning event `AccountingTampered` on the pod of each container whose accounting file's
        ``tampered`` count grew since the last round: a process of it found the shared figures lowered behind the
        library's back (LAYOUT.md), refused that allocation and repaired them. The file is the tenant's to write, so
        this is what the library saw, not proof; the driver's count (the round above) stays the judge."""
        seen: dict[tuple[str, int], int] = {}
        for c in served:
            if not c.accounting_file:
                continue
            try:
                counts = read_tampered(c.accounting_file)
            except (OSError, AccountingFileError):
                continue  # not created yet, or rewritten whole: the library repairs it at its next allocation
            for index, count in enumerate(counts):
                key = (c.accounting_file, index)
                seen[key] = count
                before = self.tampered.get(key, 0)
                if count > before:
                    message = (
                        f"container {c.container}: a process found its accounting file's memory figures lowered "
                        f"behind the isolation library's back on device {index} ({count - before} time(s) since "
                        "the last round); the allocation was refused and the figures repaired"
                    )
                    log.warning("pod %s/%s: %s", c.namespace, c.pod, message)
                    obj = {"metadata": {"name": c.pod, "namespace": c.namespace, "uid": c.pod_uid}, "kind": "Pod"}
                    self.cluster.record_event(obj, "AccountingTampered", message, warning=True)
        self.tampered = seen

    def _cannot_read(self, c: ServedContainer, unknown: set[str]) -> None:
        if c.pod_uid not in self._unreadable:
            self._unreadable.add(c.pod_uid)
            log.warning(
                "pod %s/%s: its placement names %s, which are no device ids here (HAMi names some whole cards by "
                "capacity): its processes on other devices are not judged",
                c.namespace, c.pod, ", ".join(sorted(unknown)),
            )  # fmt: skip

    def _processes(
        self, kinds: Iterable[str], pods: set[str], owners: dict[int, tuple[str, str]]
    ) -> list[DeviceProcess]:
        """Every served kind's device processes: the management library's (`hami_device_processes`), and, from the
        kernel's DRM fdinfo (`hami.node.drmusage`), the memory of the kinds whose library has none and the busy time
        of every kind that gives a DRM source. `owners` is filled with the served pods' processes found for it."""
        found: list[DeviceProcess] = []
        sources: list[DrmUsageSource] = []
        for kind in sorted(kinds):
            try:
                answer = self.plugins.device_processes(kind)
                source = self.plugins.drm_usage_source(kind)
            except Exception:
                log.exception("the %s plugin failed to list its devices' processes; not checked this round", kind)
                continue
            if source is not None and answer is not None:
                source = source.model_copy(update={"memory_regions": ()})  # the library's figure is the judge
            if source is not None and (source.memory_regions or source.engines):
                sources.append(source)
            found += answer or []
        if sources:
            owners.update(pod_processes(self.settings.proc_root, pods))
            found += self.drm.read(sources, owners)
        return found

    def _by_container_id(self, candidates: Sequence[ServedContainer], container_id: str) -> ServedContainer | None:
        if not container_id:
            return None
        first = candidates[0]
        try:
            pod = self.cluster.get("pods", first.pod, first.namespace)
        except ClusterError as exc:
            log.warning("cannot read pod %s/%s to tell its containers apart: %s", first.namespace, first.pod, exc)
            return None
        status = pod.get("status") or {}
        for entry in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
            if str(entry.get("containerID") or "").rpartition("://")[2] == container_id:
                return next((c for c in candidates if c.container == entry.get("name")), None)
        return None

    def _judge(self, c: ServedContainer, uuid: str, held: _Holding) -> Overrun | None:
        limit = sum(d.usedmem for d in c.devices if d.uuid == uuid) * MiB
        if held.used <= limit:
            return None
        killed = self.settings.kill
        if killed:
            for pid in held.pids:
                try:
                    self._kill(pid)
                except ProcessLookupError:
                    pass  # it ended by itself
                except OSError as exc:
                    log.error("cannot kill process %d of %s/%s: %s", pid, c.namespace, c.pod, exc)
                    killed = False
        overrun = Overrun(c, uuid, held.used, limit, tuple(held.pids), killed)
        self._report(overrun, c.container)
        return overrun

    def _judge_pod(self, containers: Sequence[ServedContainer], uuid: str, held: _Holding) -> Overrun | None:
        """Processes whose container could not be told apart: the pod's sum against the pod's grant, no kill."""
        limit = sum(d.usedmem for c in containers for d in c.devices if d.uuid == uuid) * MiB
        if held.used <= limit:
            return None
        overrun = Overrun(containers[0], uuid, held.used, limit, tuple(held.pids), killed=False)
        self._report(overrun, "")
        return overrun

    def _report(self, overrun: Overrun, container: str) -> None:
        c = overrun.container
        key = (c.namespace, c.pod, container, overrun.device_uuid)
        self.overruns[key] = self.overruns.get(key, 0) + 1
        who = f"container {container}" if container else "its containers"
        done = f"killed processes {', '.join(map(str, overrun.pids))}" if overrun.killed else "nothing was killed"
        message = (
            f"{who} held {overrun.used_bytes // MiB} MiB on device {overrun.device_uuid}, by the driver's count, "
            f"over the {overrun.limit_bytes // MiB} MiB it was granted; {done}"
        )
        log.warning("pod %s/%s: %s", c.namespace, c.pod, message)
        obj = {"metadata": {"name": c.pod, "namespace": c.namespace, "uid": c.pod_uid}, "kind": "Pod"}
        self.cluster.record_event(obj, "DeviceMemoryOverLimit", message, warning=True)

    # ---------------------------------------------------------------------------------- metrics

    def collect(self) -> Iterable[Metric]:
        used = GaugeMetricFamily(
            "hami_backstop_device_memory_bytes",
            "device memory a container's processes hold, by the driver's count (the backstop's last round)",
            labels=_LABELS,
        )
        for (namespace, pod, container, uuid), value in sorted(self.used.items()):
            used.add_metric([namespace, pod, container, uuid], value)
        overruns = CounterMetricFamily(
            "hami_backstop_overruns",
            "rounds in which a container held more device memory than it was granted",
            labels=_LABELS,
        )
        for (namespace, pod, container, uuid), count in sorted(self.overruns.items()):
            overruns.add_metric([namespace, pod, container, uuid], count)
        yield used
        yield overruns


def _key(c: ServedContainer, uuid: str) -> tuple[str, str, str, str]:
    return (c.namespace, c.pod, c.container, uuid)
