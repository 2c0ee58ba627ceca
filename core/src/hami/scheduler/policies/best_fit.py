"""The `best-fit` node policy: the node that keeps the least free device share after the placement first."""

from __future__ import annotations

from hami.scheduler.policies.base import NodeKey, NodePolicy, PodShape
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["BestFit"]


class BestFit(NodePolicy):
    name = "best-fit"

    def order(self, state: ClusterState, pod: PodShape) -> NodeKey:
        kind = pod.kinds[0]
        count = pod.largest[kind].count
        shares = pod.shares

        def leftover(record: NodeRecord) -> float:
            left = sum(state.signature(record, kind)) - count * shares(record, kind)
            return float(left) if left >= 0 else float("inf")

        return leftover
