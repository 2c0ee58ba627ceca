"""Publishing how busy each device is, on the Node, for the scheduler's `usage` policy.

Owns measuring each of this node's devices' busy share (percent of the time busy) and writing it to the Node
annotation `hami.measured.BUSY_ANNOTATION`: the vendor's reading when its management library gives one
(`hami_device_readings`, checked by `hami.node.monitor.sane_reading`), else the busy time the kernel's DRM fdinfo
counted for the served containers' clients on its engines since the last publish (`hami.node.drmusage`, for the
vendors that give a DRM source with engines), else the sum of the shares its containers' isolation libraries
accounted (`hami.node.usage`), else nothing (the device is left out: unknown to the policy, not idle).

Writes are few: the annotation is patched only when a device's share moved by `change_points` or more since the
last write, when the set of measured devices changed, or when `refresh_seconds` passed (so a scheduler that
restarted reads a recent value); each write rebuilds the node's record in the scheduler, so writing every round on
a large cluster would cost the filters. A write that fails is logged and tried again next round. It never writes
anything but this one annotation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping

from hami.cluster.port import Cluster
from hami.measured import BUSY_ANNOTATION, decode_busy, encode_busy
from hami.model import DeviceReading, NodeInventory
from hami.node.monitor import ContainerUsage, sane_reading

__all__ = ["BusyPublisher", "measure_busy"]

log = logging.getLogger(__name__)


def measure_busy(
    inventories: Mapping[str, NodeInventory],
    readings: Iterable[DeviceReading],
    containers: Iterable[ContainerUsage],
    drm_busy: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Device id → busy percent for the devices whose share is known (see the module); `drm_busy`: device id → the
    busy percent its engines' fdinfo times give (`hami.node.drmusage.busy_between`)."""
    read = {r.device_uuid: r for r in readings}
    summed: dict[str, float] = {}
    for c in containers:
        summed[c.device_uuid] = summed.get(c.device_uuid, 0.0) + max(c.utilization_ratio, 0.0) * 100
    out: dict[str, float] = {}
    for inventory in inventories.values():
        for d in inventory.devices:
            measured = sane_reading(read.get(d.id), d).utilization_percent
            if measured is None and drm_busy and d.id in drm_busy:
                measured = min(max(drm_busy[d.id], 0.0), 100.0)
            if measured is None and d.id in summed:
                measured = min(summed[d.id], 100.0)
            if measured is not None:
                out[d.id] = measured
    return out


class BusyPublisher:
    """Measures and, when it moved enough, publishes the node's devices' busy shares (see the module)."""

    def __init__(
        self,
        cluster: Cluster,
        node: str,
        measure: Callable[[], Mapping[str, float]],
        *,
        change_points: float = 5.0,
        refresh_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.measure = measure
        self.change_points = change_points
        self.refresh_seconds = refresh_seconds
        self.clock = clock
        self._published: dict[str, float] | None = None
        self._at = -float("inf")
        self.writes = 0

    def _moved(self, now: Mapping[str, float]) -> bool:
        before = self._published
        if before is None or set(before) != set(now) or self.clock() - self._at >= self.refresh_seconds:
            return True
        return any(abs(now[k] - before[k]) >= self.change_points for k in now)

    def publish(self) -> bool:
        """One round: measure, and patch the Node when the shares moved; True when it wrote."""
        now = {k: float(round(v)) for k, v in self.measure().items()}
        if not self._moved(now):
            return False
        value = encode_busy(now) if now else None
        try:
            self.cluster.patch_metadata("nodes", self.node, annotations={BUSY_ANNOTATION: value})
        except Exception as exc:  # the API server: next round tries again
            log.warning("publishing the devices' busy shares on node %s failed: %s", self.node, exc)
            return False
        self._published = decode_busy(value)
        self._at = self.clock()
        self.writes += 1
        return True
