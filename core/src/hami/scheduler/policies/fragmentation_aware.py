"""The `fragmentation-aware` node policy (after the FGD paper): the node whose expected fragmentation under the
workload grows least first, charged for the scarce device models that restricted tasks need.

The workload is the pod's `PodShape.workload` (the extender's learned mix, `hami.scheduler.policies.workload`,
or a fixed profile); the measure is `hami.fragmentation`.
"""

from __future__ import annotations

from collections.abc import Iterable

from hami.scheduler.policies.base import NodeClass, NodeKey, NodePolicy, PodShape
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["TIE_BREAK", "FragmentationAware"]

TIE_BREAK = 1e-2
"""Weight of the free device share (thousandths) a node keeps, added to the growth of its fragmentation: among
placements that fragment alike or nearly so, the fuller node wins. 1e-2 measured best of 1e-6..5e-2 on the openb
default trace (benchmarks/openb.py); the growth itself is in thousandths of a device, so this stays a tie-breaker
between nodes whose growth differs by less than a few thousandths."""


class FragmentationAware(NodePolicy):
    name = "fragmentation-aware"

    def order(self, state: ClusterState, pod: PodShape) -> NodeKey:
        kind = pod.kinds[0]
        request = pod.largest[kind]
        shares = pod.shares
        cpu, memory = pod.cpu_memory
        workload = pod.workload
        assert workload is not None

        def growth(record: NodeRecord) -> float:
            signature = state.signature(record, kind)
            delta = workload.best_placement(
                signature,
                request.count,
                shares(record, kind),
                cpu_free=record.cpu_free,
                memory_free=record.memory_free,
                cpu=cpu,
                memory=memory,
                model=record.totals[kind].model,
            )[0]
            return delta + TIE_BREAK * sum(signature)

        return growth

    def order_class(self, state: ClusterState, pod: PodShape) -> NodeClass | None:
        kind = pod.kinds[0]
        return lambda record: (record.cpu_free, record.memory_free, record.totals[kind].model)

    def adjustment(self, state: ClusterState, pod: PodShape) -> NodeKey | None:
        """The scarcity charge: what a placement costs in device models that restricted tasks need, the model's
        pressure (`WorkloadProfile.model_pressure`) times the share taken. None when no task is restricted."""
        if pod.workload is None:
            return None
        kind = pod.kinds[0]
        pressure = pod.workload.model_pressure(state.free_by_model.get(kind, {}))
        if not pressure:
            return None
        count = pod.largest[kind].count
        shares = pod.shares

        def charge(record: NodeRecord) -> float:
            return pressure.get(record.totals[kind].model, 0.0) * count * shares(record, kind)

        return charge

    def deviceless(self, state: ClusterState, pod: PodShape, node_names: Iterable[str]) -> dict[str, float]:
        """How much placing the pod's CPU and memory on each node grows that node's expected device
        fragmentation (memoised on the node until its usage changes)."""
        workload = pod.workload
        if workload is None:
            return {}
        cpu, memory = pod.cpu_memory
        growth: dict[str, float] = {}
        key = ("deviceless", workload.serial, cpu, memory)
        for name in node_names:
            record = state.nodes.get(name)
            if record is None:
                continue
            value = record.memo.get(key)
            if value is None:
                value = 0.0
                for kind in record.totals:
                    frees = state.signature(record, kind)
                    model = record.totals[kind].model
                    before = workload.fragmentation(frees, record.cpu_free, record.memory_free, model)
                    after = workload.fragmentation(
                        frees,
                        None if record.cpu_free is None else record.cpu_free - cpu,
                        None if record.memory_free is None else record.memory_free - memory,
                        model,
                    )
                    value += after - before + TIE_BREAK * sum(frees)
                record.remember(key, value)
            growth[name] = value  # type: ignore[assignment]
        return growth
