"""The interface every node-ordering policy implements, and what a policy sees of the pod being filtered.

A node policy answers three questions for the extender's filter, and owns nothing else: in what order the
candidate nodes are fitted (`NodePolicy.order`, a per-node key memoised on the node until its usage changes, and
kept per pod shape in `hami.scheduler.ranking`), what that key must leave out because it depends on other nodes
(`NodePolicy.adjustment`, computed per node group on every filter), and which feasible node of a batch wins
(`NodePolicy.choose`). `NodePolicy.order_class` says what the key reads of a node, so that alike nodes are
evaluated once. Filtering, fitting
devices, recording and binding stay in `hami.scheduler.extender`; device choice inside a node is the vendors'
(`hami.fitting`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami.fragmentation import FULL, WorkloadProfile, request_share
from hami.model import ContainerRequest
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["NodeClass", "NodeKey", "NodePolicy", "PodShape", "Shares", "node_share"]

NodeKey = Callable[[NodeRecord], float]
"""A node's place in the order (lowest first)."""
NodeClass = Callable[[NodeRecord], Hashable]
"""What a policy's order reads of a node (`NodePolicy.order_class`)."""


def node_share(record: NodeRecord, kinds: Iterable[str]) -> float:
    """HAMi's node score before placement (divided by 10), summed over the kinds the pod asks for."""
    return sum(record.totals[kind].share() for kind in kinds)


class Shares:
    """Per filter call: each kind's largest request as a share of a node's devices (thousandths; above 1000
    when no device is that large), memoised by device size since most nodes have the same."""

    def __init__(self, largest: Mapping[str, ContainerRequest]) -> None:
        self.largest = largest
        self._memo: dict[tuple[str, tuple[int, int]], int] = {}

    def __call__(self, record: NodeRecord, kind: str) -> int:
        size = record.totals[kind].largest
        key = (kind, size)
        share = self._memo.get(key)
        if share is None:
            request = self.largest[kind]
            devmem, devcore = size
            if request.memory_percentage is None and request.memory > devmem:
                share = FULL + 1
            else:
                share = request_share(request.memory, request.memory_percentage, request.cores, devmem, devcore)
            self._memo[key] = share
        return share


@dataclass(frozen=True)
class PodShape:
    """What a node policy sees of the pod being filtered."""

    kinds: tuple[str, ...]
    """The device kinds the pod asks for, sorted; policies that order by one kind use the first."""
    largest: Mapping[str, ContainerRequest]
    """kind → the pod's largest container request of that kind."""
    shares: Shares
    cpu_memory: tuple[int, int]
    """The pod's CPU (millicores) and memory (MiB) requests."""
    workload: WorkloadProfile | None
    """The request mix to plan for (set when the pod's policy names fragmentation-aware)."""


class NodePolicy:
    """One node-ordering policy. Subclasses set `name` and implement `order`; the rest has defaults.

    A policy must be stateless between calls (one instance serves every filter): what it learns lives in the
    state it is given or in the pod's `PodShape.workload`."""

    name: str = ""
    takes_first_feasible: bool = True
    """`choose` takes the first feasible node in the order (so the extender fits candidates one by one until one
    fits); False when it compares the feasible nodes of a batch (then a batch is fitted at a time)."""

    def order(self, state: ClusterState, pod: PodShape) -> NodeKey:
        """The key candidates are fitted in (lowest first). It may read only the node and the pod: the extender
        memoises it on the node (under the pod's shape) until the node's usage changes."""
        raise NotImplementedError

    def order_class(self, state: ClusterState, pod: PodShape) -> NodeClass | None:
        """What `order` reads of a node beyond its free shares and device size, as a hashable value, for a
        single-kind pod: nodes alike in it and in those (the extender adds them) get one evaluation between
        them, so that a filter that evaluates every node (a new pod shape, a new workload profile) pays once per
        kind of node. It may read only the node (of the pod's kind): the extender memoises the class on the node,
        per policy and kind, until the node's usage changes. None (the default): every node is evaluated on its
        own."""
        return None

    def adjustment(self, state: ClusterState, pod: PodShape) -> NodeKey | None:
        """What `order` must leave out because it changes with other nodes' usage; added to the memoised key on
        every filter. It may read only the node's group (model and device size): for a single-kind pod the
        extender computes it once per group. None (the default) when nothing applies."""
        return None

    def choose(self, batch: Sequence[NodeRecord], feasible: Mapping[str, float]) -> str:
        """The winning node of a batch (in `order`'s order) given the feasible ones and their vendor scores.
        Default: the first feasible node in the batch's order."""
        return next(r.name for r in batch if r.name in feasible)

    def priority(self, share: float) -> int:
        """The 0-10 prioritize score of a node whose HAMi node share (0-1) is `share`: the emptier the higher
        by default (spread)."""
        return round(10 * (1 - share))

    def deviceless(self, state: ClusterState, pod: PodShape, node_names: Iterable[str]) -> dict[str, float]:
        """For a pod without devices: a cost per node of placing its CPU and memory there (lower is better),
        for prioritize. Empty (the default) when the policy has no opinion."""
        return {}
