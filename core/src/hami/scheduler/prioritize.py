"""The extender's prioritize verb: a 0-10 score per node, for clusters that configure it.

A pod with devices gets HAMi's node score under the node policy (binpack the fullest, spread the emptiest), from
the node's device shares as the scheduler counts them. Under the fragmentation-aware policy a pod without devices
is scored too (configure the extender without managed resources so that kube-scheduler sends every pod): its CPU
and memory can strand a node's free devices, and the node where they would grow the expected fragmentation least
scores highest (`NodePolicy.deviceless`, planned for the workload the filter learns).

Owns scoring only: it decides, counts and writes nothing (the filter does, `hami.scheduler.extender`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hami.cluster.port import KubeObject
from hami.errors import HamiError
from hami.fragmentation import WorkloadProfile
from hami.model import Pod, SchedulingPolicy, cpu_memory_requests
from hami.plugins import VendorPlugins
from hami.scheduler.policies import NODE_POLICIES, PodShape, Shares, node_share
from hami.scheduler.policy import policy_for
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import ClusterState

__all__ = ["Prioritizer"]


class Prioritizer:
    """Scores nodes for a pod over the scheduler's `ClusterState`."""

    def __init__(
        self,
        plugins: VendorPlugins,
        state: ClusterState,
        settings: ExtenderSettings,
        workload: Callable[[], WorkloadProfile | None],
    ) -> None:
        self.plugins = plugins
        self.state = state
        self.settings = settings
        self.workload = workload
        """The workload profile the fragmentation-aware policy plans for (the filter's learned one)."""

    def prioritize(self, pod_obj: KubeObject, node_names: Sequence[str]) -> dict[str, int]:
        """Scores 0-10 of `node_names` for the pod (those it cannot be scored on are left out)."""
        pod = Pod.from_api(pod_obj)
        try:
            kinds = sorted(self.plugins.pod_requests(pod))
            policy = policy_for(pod.annotations, self.settings.default_policy())
        except (HamiError, ValueError):
            return {}
        if not kinds:
            growth = self.deviceless_growth(pod_obj, node_names, policy)
            if not growth:
                return {}
            low, high = min(growth.values()), max(growth.values())
            spread = (high - low) or 1.0
            return {n: round(10 * (high - g) / spread) for n, g in growth.items()}
        scores = {}
        with self.state.lock:
            for name in node_names:
                record = self.state.nodes.get(name)
                if record is None or any(k not in record.views for k in kinds):
                    continue
                share = node_share(record, kinds) / (3 * len(kinds))
                scores[name] = NODE_POLICIES[policy.node].priority(share)
        return scores

    def deviceless_growth(
        self, pod_obj: KubeObject, node_names: Sequence[str], policy: SchedulingPolicy | None = None
    ) -> dict[str, float]:
        """For a pod without devices under the fragmentation-aware policy: how much placing its CPU and memory
        on each node grows that node's expected device fragmentation (empty under other policies)."""
        policy = policy or self.settings.default_policy()
        shape = PodShape((), {}, Shares({}), cpu_memory_requests(pod_obj.get("spec") or {}), self.workload())
        with self.state.lock:
            return NODE_POLICIES[policy.node].deviceless(self.state, shape, node_names)
