"""A usage trace for the simulator: how busy each placed pod keeps its devices, synthesised from the openb traces.

The openb traces (Alibaba cluster-trace-gpu-v2023) give each pod's request, its QoS class and its creation,
scheduling and deletion times, but no utilization column (the 2020 PAI trace had one; this one does not). So the
busy share of each pod's grant is drawn from its QoS class, deterministically from the seed and the pod's place
in the arrival sequence (every policy sees the same usage):

| QoS | what the class holds in the trace | busy share of its grant |
|---|---|---|
| `BE` (best effort) | batch training and offline jobs | 90-100 % (saturating) |
| `LS` (latency sensitive) | online inference and services | 10-40 % |
| `Burstable` | | 40-80 % |
| `Guaranteed` | | 60-90 % |
| other, or a trace without the column | | 50 % |

A pod's grant on a device is its cores (`gpu_milli / 10` percent for a sharing pod, 100 for each whole GPU), so a
device's busy share is the sum over its pods of grant × busy share, at most 100. The simulator publishes it on each
node as the node daemons do (`hami.measured`), so the `usage` policy reads it exactly as in a cluster.

What is measured (`Contention`): for each latency-sensitive pod placed on a share of a GPU (a pod holding whole GPUs
has no neighbour there), how busy its device is with the other pods' work when it lands (what its placement
decided) and at the end of the run (no departures: later pods landed beside it too): the share of those pods
beside a saturating neighbour (50 % or more of the device busy with others' work), and the mean of that share.

The simulator's `usage` run is the opt-in as a cluster would use it: the latency-sensitive pods ask for the `usage`
policy (`hami.io/node-scheduler-policy: usage`), every other pod gets the cluster's default (`binpack`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hami.simulate.trace import TracePod

__all__ = [
    "BUSY_RANGES", "CONTENDED_PERCENT", "LATENCY_SENSITIVE", "Contention", "UsageTracker", "busy_share", "contention"
]  # fmt: skip

BUSY_RANGES: Mapping[str, tuple[float, float]] = {
    "BE": (0.9, 1.0),
    "LS": (0.1, 0.4),
    "Burstable": (0.4, 0.8),
    "Guaranteed": (0.6, 0.9),
}
"""QoS class → the range a pod's busy share of its grant is drawn from (uniformly)."""
LATENCY_SENSITIVE = "LS"
"""The QoS class that opts in to the `usage` policy in the simulator's `usage` run."""
CONTENDED_PERCENT = 50.0
"""A latency-sensitive pod is contended when its device is this busy (percent) with other pods' work."""


def busy_share(pod: TracePod, index: int, seed: int) -> float:
    """The share (0-1) of its grant the `index`-th arriving pod keeps busy (see the module)."""
    low, high = BUSY_RANGES.get(pod.qos, (0.5, 0.5))
    return random.Random(f"{seed}/{index}/{pod.name}").uniform(low, high)


@dataclass(frozen=True)
class Contention:
    latency_pods: int
    """Latency-sensitive pods placed on a share of a GPU."""
    contended: int
    """Those whose device carries `CONTENDED_PERCENT` or more of other pods' work at the end."""
    neighbour_busy_mean: float
    """The mean, over those pods, of the busy share (percent) of other pods' work on their device at the end."""
    contended_on_arrival: int = 0
    """Those whose device carried `CONTENDED_PERCENT` or more of other pods' work when they landed."""
    neighbour_busy_on_arrival: float = 0.0
    """The mean busy share of other pods' work on their device when they landed."""

    @property
    def contended_pct(self) -> float:
        return round(100 * self.contended / self.latency_pods, 2) if self.latency_pods else 0.0

    @property
    def contended_on_arrival_pct(self) -> float:
        return round(100 * self.contended_on_arrival / self.latency_pods, 2) if self.latency_pods else 0.0


def contention(
    placed: Mapping[str, tuple[str, Mapping[str, float]]],
    device_busy: Mapping[str, float],
    on_arrival: Mapping[str, float] | None = None,
) -> Contention:
    """`placed`: pod key → (its QoS, device → busy percent the pod itself adds there); `device_busy`: device → the
    busy percent of all its pods (uncapped); `on_arrival`: pod key → others' busy share on its device when it
    landed."""
    others: list[float] = []
    arrival: list[float] = []
    for key, (qos, own) in placed.items():
        if qos != LATENCY_SENSITIVE or not own:
            continue
        others.append(max(min(device_busy.get(d, 0.0) - mine, 100.0) for d, mine in own.items()))
        arrival.append((on_arrival or {}).get(key, 0.0))
    return Contention(
        len(others),
        sum(1 for b in others if b >= CONTENDED_PERCENT),
        round(sum(others) / len(others), 2) if others else 0.0,
        sum(1 for b in arrival if b >= CONTENDED_PERCENT),
        round(sum(arrival) / len(arrival), 2) if arrival else 0.0,
    )


def pod_busy(grants: Mapping[str, int], share: float) -> dict[str, float]:
    """Device → the busy percent a pod granted `grants` (device → cores percent) adds at busy share `share`."""
    return {device: cores * share for device, cores in grants.items()}


def merge(device_busy: dict[str, float], added: Mapping[str, float]) -> None:
    for device, busy in added.items():
        device_busy[device] = device_busy.get(device, 0.0) + busy


def node_busy(devices: Sequence[str], device_busy: Mapping[str, float]) -> dict[str, float]:
    """The measured shares a node daemon would publish for `devices` (capped at 100)."""
    return {d: min(device_busy.get(d, 0.0), 100.0) for d in devices}


class UsageTracker:
    """The busy share each placed pod adds to its devices, kept as pods are placed; `publish(node, shares)` is told
    each node's new shares after a pod lands there (the simulator writes them where the node daemon would)."""

    def __init__(
        self,
        seed: int,
        devices_of: Callable[[str], Sequence[str]],
        publish: Callable[[str, dict[str, float]], None] | None = None,
    ) -> None:
        self.seed = seed
        self.devices_of = devices_of
        self.publish = publish
        self.device_busy: dict[str, float] = {}
        self.placed: dict[str, tuple[str, dict[str, float]]] = {}
        self.on_arrival: dict[str, float] = {}

    def place(self, key: str, pod: TracePod, index: int, node: str, devices: Sequence[str]) -> None:
        """Pod `key` (the `index`-th arrival) landed on `devices` of `node`."""
        cores = pod.gpu_milli / 10 if pod.num_gpu == 1 and pod.gpu_milli < 1000 else 100.0
        added = pod_busy(dict.fromkeys(devices, round(cores)), busy_share(pod, index, self.seed))
        self.on_arrival[key] = max((min(self.device_busy.get(d, 0.0), 100.0) for d in devices), default=0.0)
        merge(self.device_busy, added)
        if pod.num_gpu == 1 and pod.gpu_milli < 1000:  # only a share has neighbours on its device
            self.placed[key] = (pod.qos, added)
        if self.publish is not None:
            self.publish(node, node_busy(self.devices_of(node), self.device_busy))

    def contention(self) -> Contention:
        return contention(self.placed, self.device_busy, self.on_arrival)
