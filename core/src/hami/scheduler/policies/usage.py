"""The `usage` node policy: the node whose least busy device (as its node daemon measured it) is idlest first.

Opt-in (`hami.io/node-scheduler-policy: usage`, or `nodePolicy: usage`), for pods that care more about not
sharing a device with a saturating neighbour than about packing: a latency-sensitive inference pod, say. Each
node daemon publishes each device's measured busy share on its Node (`hami.measured`, written by
`hami.node.busy`); this policy orders candidate nodes by the lowest busy share among the node's devices of the
pod's kind that still have a free slot (a device whose share is unknown counts as `hami.measured.UNKNOWN_BUSY`:
neither preferred over a measured idle device nor ruled out), then by HAMi's node share (the emptiest by grant
first), and takes the first node that fits. Its device choice is the `usage` device policy (`hami.fitting`: the
least busy devices that fit), unless the pod names another.

What it reads changes only when the node daemon republishes, which rebuilds the node's record and so drops the
memoised keys (`ClusterState.set_node`): no stale order outlives a new measurement.
"""

from __future__ import annotations

from hami.measured import BUSY_ANNOTATION, UNKNOWN_BUSY, decode_busy
from hami.scheduler.policies.base import NodeClass, NodeKey, NodePolicy, PodShape
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["Usage", "least_busy"]


def least_busy(record: NodeRecord, kind: str) -> float:
    """The lowest measured busy share (percent) among the node's devices of `kind` with a free slot; 100 when none
    has one."""
    view = record.views.get(kind)
    if view is None:
        return 100.0
    busy = decode_busy(record.annotations.get(BUSY_ANNOTATION))
    free = [busy.get(u.device.id, UNKNOWN_BUSY) for u in view.devices if u.used < u.device.count and u.device.health]
    return min(free, default=100.0)


class Usage(NodePolicy):
    name = "usage"

    def order(self, state: ClusterState, pod: PodShape) -> NodeKey:
        kinds = pod.kinds

        def key(record: NodeRecord) -> float:
            busy = max(least_busy(record, kind) for kind in kinds)
            share = sum(record.totals[kind].share() for kind in kinds)  # at most 3 per kind: below one busy point
            return busy + share / (4 * len(kinds))

        return key

    def order_class(self, state: ClusterState, pod: PodShape) -> NodeClass | None:
        kind = pod.kinds[0]

        def measured(record: NodeRecord) -> tuple[float, ...]:
            t = record.totals[kind]
            return (least_busy(record, kind), t.slots, t.cores, t.memory, t.used, t.usedcores, t.usedmem)

        return measured
