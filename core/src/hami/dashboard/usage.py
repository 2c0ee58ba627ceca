"""Real usage for the device page, from the node daemon's metrics (`hami node`'s `/metrics`), when reachable.

Owns turning a metrics URL template into a node's URL (`{node}` the Node's name, `{address}` its InternalIP,
e.g. `http://{address}:9394/metrics`), fetching it with a short timeout, and reading the families of
`hami.node.monitor` for one device: the memory each container uses and its share of the device
(`hami_vgpu_memory_used_bytes`, `hami_container_device_utilization_ratio`) and the device's own
(`hami_host_gpu_memory_used_bytes`, `hami_host_gpu_utilization_ratio`). A node that does not answer, or answers
something else, yields a `DeviceUsage` with the reason instead of figures: the page says so and shows the grants.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from hami.cluster.port import KubeObject, meta

__all__ = ["ContainerUse", "DeviceUsage", "device_usage", "metrics_url"]

TIMEOUT_SECONDS = 1.5
MAX_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class ContainerUse:
    namespace: str
    pod: str
    container: str
    memory_used: int = 0  # MiB
    utilization: float = 0.0


@dataclass
class DeviceUsage:
    url: str
    error: str = ""
    memory_used: int | None = None
    utilization: float | None = None
    containers: list[ContainerUse] = field(default_factory=list)

    def of_pod(self, namespace: str, pod: str) -> tuple[int, float] | None:
        """Memory (MiB) and device share its containers use, summed; None when the metrics name none."""
        mine = [c for c in self.containers if (c.namespace, c.pod) == (namespace, pod)]
        if not mine:
            return None
        return sum(c.memory_used for c in mine), sum(c.utilization for c in mine)


def metrics_url(template: str, node: KubeObject) -> str:
    addresses = (node.get("status") or {}).get("addresses") or ()
    address = next((str(a.get("address")) for a in addresses if a.get("type") == "InternalIP"), "")
    return template.replace("{node}", str(meta(node).get("name") or "")).replace("{address}", address)


def device_usage(template: str, node: KubeObject, uuid: str) -> DeviceUsage:
    url = metrics_url(template, node)
    if "://" not in url or url.split("://", 1)[1].startswith((":", "/")):
        return DeviceUsage(url, error="the node publishes no InternalIP address to reach its metrics at")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as answer:
            text = answer.read(MAX_BYTES).decode("utf-8", "replace")
    except (OSError, ValueError, urllib.error.URLError) as exc:
        return DeviceUsage(url, error=f"the node daemon's metrics did not answer: {getattr(exc, 'reason', exc)}")
    usage = DeviceUsage(url)
    per: dict[tuple[str, str, str], dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels: Mapping[str, str] = sample.labels
                if labels.get("device_uuid") != uuid:
                    continue
                if sample.name == "hami_host_gpu_memory_used_bytes":
                    usage.memory_used = int(sample.value) // MIB
                elif sample.name == "hami_host_gpu_utilization_ratio":
                    usage.utilization = float(sample.value)
                elif sample.name in ("hami_vgpu_memory_used_bytes", "hami_container_device_utilization_ratio"):
                    key = (labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", ""))
                    per.setdefault(key, {})[sample.name] = float(sample.value)
    except ValueError as exc:
        return DeviceUsage(url, error=f"the node daemon's metrics are not Prometheus text: {exc}")
    usage.containers = [
        ContainerUse(ns, pod, c, int(v.get("hami_vgpu_memory_used_bytes", 0)) // MIB,
                     v.get("hami_container_device_utilization_ratio", 0.0))
        for (ns, pod, c), v in sorted(per.items())
    ]  # fmt: skip
    return usage
