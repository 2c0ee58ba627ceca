"""The `binpack` node policy: HAMi's node score, the fullest node first, and the vendors' highest score wins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami.scheduler.policies.base import NodeClass, NodeKey, NodePolicy, PodShape, node_share
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["Binpack"]


class Binpack(NodePolicy):
    name = "binpack"
    sign = -1.0
    takes_first_feasible = False  # the vendors' scores decide among a batch's feasible nodes

    def order(self, state: ClusterState, pod: PodShape) -> NodeKey:
        sign = self.sign
        if len(pod.kinds) == 1:
            kind = pod.kinds[0]
            return lambda record: sign * record.totals[kind].share()
        kinds = pod.kinds
        return lambda record: sign * node_share(record, kinds)

    def order_class(self, state: ClusterState, pod: PodShape) -> NodeClass | None:
        kind = pod.kinds[0]

        def share_inputs(record: NodeRecord) -> tuple[int, ...]:
            t = record.totals[kind]
            return (t.slots, t.cores, t.memory, t.used, t.usedcores, t.usedmem)

        return share_inputs

    def choose(self, batch: Sequence[NodeRecord], feasible: Mapping[str, float]) -> str:
        return max(sorted(feasible), key=lambda n: feasible[n])

    def priority(self, share: float) -> int:
        return round(10 * share)
