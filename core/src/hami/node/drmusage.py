"""What the served containers' DRM clients hold and keep busy, from the kernel's fdinfo, round after round.

Owns turning the open DRM files of the processes the backstop found in served containers (`hami.drmfdinfo`)
into what the node daemon acts on, for the vendors that give a `hami.model.DrmUsageSource`:

- **memory per process and device**, as `DeviceProcess` entries the backstop judges like a management library's:
  a client is matched to a device by its ``drm-pdev`` (and ``drm-driver`` among the source's drivers), and counted
  once per container however many descriptors and processes hold it (``drm-client-id``, unique per device: a
  descriptor duplicated, inherited across ``fork`` or passed to another process of the container is one client,
  counted with the first process that holds it, in pid order). A client shared with another container is counted in
  each, so that no container hides memory behind another's descriptor. Without ``drm-client-id`` each descriptor
  is a client of its own: a duplicated descriptor counts twice, never less;
- **the busy time of each device's engines**: for each client and engine the growth of ``drm-engine-<engine>``
  since the last round, divided by the engine's capacity, added to the device's running total. As the document
  asks, a value lower than one read before is held at the larger one until it catches up, and a client seen for
  the first time is only the baseline (its past is not this interval's work). `busy_between` turns two snapshots
  of the totals into each device's busy percent over that window: the busiest engine's share of the wall time,
  at most 100.

What it does not see: clients of processes outside the served containers (the busy share is the served
containers' work, as the accounting files' sum is), work a runtime submits around the DRM scheduler (amdgpu's
KFD user queues: ROCm and DTK compute), whatever a driver does not publish, and an open DRM file no descriptor names
any more: a process that maps a buffer (or, on amdgpu, hands the file to KFD) and then closes its descriptor keeps the
file, and its memory, alive where no ``/proc/<pid>/fd`` shows it. Its cost grows with the descriptors the served
containers hold (each is one ``stat``), which a tenant chooses. It reads only; nothing is written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hami.drmfdinfo import DrmClient, memory_bytes, read_process
from hami.model import DeviceProcess, DrmUsageSource

__all__ = ["BusySnapshot", "BusyWindow", "DrmUsage", "busy_between"]

Owner = tuple[str, str]
"""(pod UID, container id) of a process, from its cgroup."""
_ClientKey = tuple[object, ...]


@dataclass(frozen=True)
class BusySnapshot:
    """The devices' engine busy totals at one moment (`DrmUsage.snapshot`)."""

    at: float
    """Seconds, on the usage reader's monotonic clock."""
    busy_ns: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Device id → engine → nanoseconds busy counted since the reader started."""


def busy_between(before: BusySnapshot | None, after: BusySnapshot) -> dict[str, float]:
    """Device id → busy percent between two snapshots: the busiest engine's busy time over the wall time, at most
    100; {} without an earlier snapshot or time between them."""
    if before is None or after.at <= before.at:
        return {}
    wall_ns = (after.at - before.at) * 1e9
    shares: dict[str, float] = {}
    for device, engines in after.busy_ns.items():
        earlier = before.busy_ns.get(device, {})
        busiest = max((ns - earlier.get(engine, 0.0) for engine, ns in engines.items()), default=0.0)
        shares[device] = min(max(busiest, 0.0) / wall_ns * 100, 100.0)
    return shares


class DrmUsage:
    """The running reader of the served containers' DRM clients (see the module); one per backstop."""

    def __init__(self, proc_root: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc_root = proc_root
        self.clock = clock
        self._busy_ns: dict[str, dict[str, float]] = {}
        self._last: dict[tuple[_ClientKey, str], int] = {}
        """(client, engine) → the largest busy time read so far."""
        self.clients = 0
        """DRM clients matched to a device at the last round."""
        self._at = 0.0

    def read(self, sources: Sequence[DrmUsageSource], owners: Mapping[int, Owner]) -> list[DeviceProcess]:
        """One round over the processes `owners` names (host pid → its container): the memory each holds on the
        sources' devices (for sources with memory regions), and the engines' busy time added to the totals."""
        self._at = self.clock()
        devices: dict[str, tuple[DrmUsageSource, str]] = {}
        for source in sources:
            for bus, uuid in source.devices.items():
                devices[bus] = (source, uuid)
                for engine in source.engines:
                    self._busy_ns.setdefault(uuid, {}).setdefault(engine, 0.0)
        held: dict[tuple[int, str], int] = {}
        seen: set[_ClientKey] = set()
        last: dict[tuple[_ClientKey, str], int] = {}
        for pid in sorted(owners):
            for fd, client in read_process(self.proc_root, pid):
                match = devices.get(client.pdev)
                if match is None or client.driver not in match[0].drivers:
                    continue
                source, uuid = match
                key: _ClientKey = (
                    (owners[pid], client.pdev, client.client_id)
                    if client.client_id is not None
                    else (owners[pid], client.pdev, pid, fd)
                )
                if key in seen:
                    continue
                seen.add(key)
                if source.memory_regions:
                    held[(pid, uuid)] = held.get((pid, uuid), 0) + memory_bytes(client, source.memory_regions)
                self._engines(client, key, source.engines, self._busy_ns[uuid] if source.engines else {}, last)
        self._last = last  # clients gone are forgotten
        self.clients = len(seen)
        return [DeviceProcess(device_uuid=uuid, pid=pid, used_bytes=b) for (pid, uuid), b in sorted(held.items())]

    def _engines(
        self,
        client: DrmClient,
        key: _ClientKey,
        engines: tuple[str, ...],
        totals: dict[str, float],
        last: dict[tuple[_ClientKey, str], int],
    ) -> None:
        for engine in engines:
            value = client.engines.get(engine)
            if value is None:
                continue
            before = self._last.get((key, engine))
            if before is not None and value > before:
                totals[engine] += (value - before) / client.capacity.get(engine, 1)
            last[(key, engine)] = value if before is None else max(before, value)

    def snapshot(self) -> BusySnapshot:
        """The devices' busy totals as of the last round, for `busy_between`."""
        return BusySnapshot(self._at, {d: dict(e) for d, e in self._busy_ns.items()})


class BusyWindow:
    """The devices' busy shares over the window since its previous call, for a reader that asks now and then (the
    busy publisher, every ``busyPublishSeconds``) while the backstop's rounds keep counting."""

    def __init__(self, usage: DrmUsage) -> None:
        self.usage = usage
        self._mark: BusySnapshot | None = None

    def shares(self) -> dict[str, float]:
        """Device id → busy percent since the last call; {} at the first."""
        now = self.usage.snapshot()
        shares, self._mark = busy_between(self._mark, now), now
        return shares
