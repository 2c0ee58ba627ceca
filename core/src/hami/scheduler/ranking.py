"""The candidate index: per pod shape, the nodes a filter is asked about, ranked by the node policy's key and
kept current from the state's change log.

kube-scheduler names up to every node in each filter (nodeCacheCapable: those that passed its own checks), and a
filter used to evaluate each of them in turn: at 5,000 nodes that loop was most of its time. A `Ranking` is that
evaluation kept for one pod shape (the extender's memo id) over every node of the state: the nodes that cannot
take the shape with why, and the others sorted by the policy's order key (`NodePolicy.order`) in one list per node
group (model and device size). A later filter of the same shape re-evaluates only the nodes changed since
(`ClusterState.changes`: usually the few its last decisions touched), and reads its candidates by merging the
groups' lists, each with its group's adjustment (`NodePolicy.adjustment`, which depends on other nodes) added as it
is read, skipping the nodes the filter does not name. The order is the one the full loop gives, ties going to the
node name, so decisions do not depend on whether the index was used.

Building a ranking (a new shape, or a new workload profile for the fragmentation-aware policy, which changes every
key) is a filter's slowest path, so it is done in one pass: with the policy's node classes (`Rankings.current`'s
`classes`: nodes that evaluate alike, kept per policy and kind from the change log like a ranking) one node of each
class is evaluated, the others read their class from one dict, and each group's list is sorted once. At 5,000
nodes that is about 2 ms, against 30 ms node by node.

Thread-safety: none of its own; the extender uses it under the state's lock.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping

from hami.scheduler.state import ClusterState

__all__ = ["Evaluation", "Ranking", "Rankings"]

Evaluation = tuple[str | None, float, int]
"""What a filter makes of one node: why it cannot take the pod (None: it can), its order key, its group. Kept as
given (alike nodes may share one), so that a rebuild allocates little beyond the sorted lists."""

RANKINGS_KEPT = 32
"""Pod shapes whose rankings are kept (least recently used dropped first); each holds an entry per node."""
CLASSES_KEPT = 8
"""Node partitions (`Rankings.current`'s classes: one per node policy and device kind in use) kept likewise."""


class Ranking:
    """One pod shape's evaluation of the nodes named in a filter."""

    def __init__(self, position: int) -> None:
        self.position = position
        """The change log position up to which the ranking is current."""
        self.failed: dict[str, str] = {}
        """Node → why it cannot take the shape."""
        self.groups: dict[int, list[tuple[float, str]]] = {}
        """Node group → its other nodes as (order key, name), sorted."""
        self.ranked: dict[str, Evaluation] = {}
        """Node → its evaluation (no reason: it can take the shape), for the nodes that can take the shape."""

    @classmethod
    def build(
        cls,
        position: int,
        names: Iterable[str],
        evaluate: Callable[[str], Evaluation],
        classes: Mapping[str, Hashable] | None = None,
    ) -> Ranking:
        """The ranking of every node in `names`, each evaluated once, or with `classes` (node → its class, over the
        same nodes) one node of each class, the others taking its evaluation. As many `put`s would give, at a
        fraction of the cost (a rebuild is a filter's slowest path: a new shape or workload profile): the names
        are sorted once, and each group's list sorted once by key alone, which keeps the names' order among equal
        keys."""
        ranking = cls(position)
        failed, ranked, groups = ranking.failed, ranking.ranked, ranking.groups
        evaluated: dict[Hashable, Evaluation] = {}
        for name in sorted(names):
            if classes is None:
                evaluation = evaluate(name)
            else:
                node_class = classes[name]
                found = evaluated.get(node_class)
                if found is None:
                    found = evaluated[node_class] = evaluate(name)
                evaluation = found
            reason, key, group = evaluation
            if reason is not None:
                failed[name] = reason
            else:
                ranked[name] = evaluation
                entries = groups.get(group)
                if entries is None:
                    entries = groups[group] = []
                entries.append((key, name))
        for entries in groups.values():
            entries.sort(key=_key)
        return ranking

    def put(self, name: str, evaluation: Evaluation) -> None:
        """Set (or replace) a node's evaluation."""
        old = self.ranked.pop(name, None)
        if old is not None:
            ranked = self.groups[old[2]]
            del ranked[bisect.bisect_left(ranked, (old[1], name))]
        else:
            self.failed.pop(name, None)
        reason, key, group = evaluation
        if reason is not None:
            self.failed[name] = reason
        else:
            bisect.insort(self.groups.setdefault(group, []), (key, name))
            self.ranked[name] = evaluation

    def ordered(self, adjustments: Mapping[int, float], names: Container[str]) -> Iterator[tuple[float, str]]:
        """The nodes among `names` that can take the shape, lowest key first, each group's adjustment (default 0)
        added."""
        streams = []
        for group, ranked in self.groups.items():
            extra = adjustments.get(group, 0.0)
            streams.append(iter(ranked) if not extra else _shifted(ranked, extra))
        return (entry for entry in heapq.merge(*streams) if entry[1] in names)

    def representatives(self) -> dict[int, str]:
        """One node of each group that has any, for the per-group adjustment."""
        return {group: ranked[0][1] for group, ranked in self.groups.items() if ranked}


_key = operator.itemgetter(0)


def _shifted(ranked: list[tuple[float, str]], extra: float) -> Iterator[tuple[float, str]]:
    for key, name in ranked:
        yield key + extra, name


class Rankings:
    """The rankings of the most recent pod shapes, brought up to date when asked for."""

    def __init__(self, state: ClusterState, kept: int = RANKINGS_KEPT) -> None:
        self.state = state
        self.kept = kept
        self._rankings: OrderedDict[int, Ranking] = OrderedDict()
        self._classes: OrderedDict[Hashable, tuple[int, dict[str, Hashable]]] = OrderedDict()
        """Partition name → (change log position it is current to, node → class)."""
        self.rebuilds = 0
        """How many rankings were built from every node (a new shape, node list, or a dropped change log)."""

    def current(
        self,
        shape: int,
        evaluate: Callable[[str], Evaluation],
        classes: tuple[Hashable, Callable[[str], Hashable]] | None = None,
    ) -> Ranking:
        """The ranking of `shape` over the state's nodes, current with it; the caller holds the state's lock.

        `classes`, when given, is a partition of the nodes that `evaluate` answers alike within each part: (a name
        for it, the class of a node). It is kept current from the change log as rankings are, for every shape
        that names it, so that building a ranking evaluates one node per class."""
        position = self.state.changes.position
        ranking = self._rankings.get(shape)
        changed = self.state.changes.since(ranking.position) if ranking is not None else None
        if ranking is None or changed is None:
            if classes is None:
                ranking = Ranking.build(position, self.state.nodes, evaluate)
            else:
                of = self._partition(position, *classes)
                ranking = Ranking.build(position, of, evaluate, of)
            self.rebuilds += 1
        else:
            for name in changed:
                ranking.put(name, evaluate(name))
            ranking.position = position
        self._rankings[shape] = ranking
        self._rankings.move_to_end(shape)
        while len(self._rankings) > self.kept:
            self._rankings.popitem(last=False)
        return ranking

    def _partition(self, position: int, key: Hashable, node_class: Callable[[str], Hashable]) -> dict[str, Hashable]:
        """Node → class for every node of the state, brought up to date with the nodes changed since."""
        kept = self._classes.get(key)
        changed = self.state.changes.since(kept[0]) if kept is not None else None
        if kept is None or changed is None:
            of = {name: node_class(name) for name in self.state.nodes}
        else:
            of = kept[1]
            nodes = self.state.nodes
            for name in changed:
                if name in nodes:
                    of[name] = node_class(name)
                else:
                    of.pop(name, None)
        self._classes[key] = (position, of)
        self._classes.move_to_end(key)
        while len(self._classes) > min(self.kept, CLASSES_KEPT):
            self._classes.popitem(last=False)
        return of
