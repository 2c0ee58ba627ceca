"""Candidate ordering: which of the named nodes a filter asks the vendors to fit, in which order and batches.

A node is a candidate when it registers every kind the pod asks for and passes a cheap necessary check on its
devices' free shares (`ShapeEvaluation.free_share_check`, exact about what is missing); the others get their
reason at once. Candidates are ordered by the node policy's key (`NodePolicy.order`), plus what that key leaves
out because it depends on other nodes or on the pod's type selectors (`adjustment`), ties going to the node name,
and handed out in batches: the first holds one node under a policy that takes the first feasible node, else
`batch_size`; the later ones `batch_size` each. With `pass_over_nodes_in_flight`, nodes whose earlier decisions
still await their Allocate come after all the others, fewest waiting first, since a bind there waits for their
node lock.

A single-kind pod reads its candidates from its shape's ranking (`hami.scheduler.ranking`), kept current from the
state's change log; a pod of several kinds evaluates every named node, each evaluation memoised on the node until
it changes (`memoised`). Memo keys and node classes are small integers (`MemoIds`), hashed once per filter.

Owns the order only: which node is chosen, and the vendors' fits, belong to the filter (`hami.scheduler.extender`).
Thread-safety: none of its own; the filter calls it under the state's lock.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence, Set
from typing import TypeVar

from hami.fitting import Selectors
from hami.model import ContainerRequest, Pod, SchedulingPolicy
from hami.scheduler.policies import NODE_POLICIES, NodeKey, NodePolicy, PodShape, Shares
from hami.scheduler.ranking import Evaluation, Rankings
from hami.scheduler.settings import ExtenderSettings
from hami.scheduler.state import ClusterState, NodeRecord

__all__ = ["UNSELECTED_LAST", "Candidates", "MemoIds", "ShapeEvaluation", "memoised"]

T = TypeVar("T")

UNSELECTED_LAST = 1e15
"""Added to the order key of a node whose device model the pod's type selector refuses, so that batches try the
nodes of the selected models first (the vendor's fit still decides; this only orders)."""


class MemoIds:
    """Small integers standing for per-node memo keys and node classes, drawn from one counter and never reused,
    so that forgetting old keys cannot make a node's stale evaluation look current."""

    def __init__(self) -> None:
        self._memo_ids: dict[tuple[object, ...], int] = {}
        self._class_ids: dict[tuple[object, ...], int] = {}
        self._counter = itertools.count()

    def memo(self, key: tuple[object, ...]) -> int:
        """The number of a per-node memo key (hashed once per filter, not once per node)."""
        return self._small_id(self._memo_ids, key, 4096)

    def node_class(self, node_class: tuple[object, ...]) -> int:
        """The number of a node class (what a policy's order reads of a node, `NodePolicy.order_class`)."""
        return self._small_id(self._class_ids, node_class, 65536)

    def _small_id(self, ids: dict[tuple[object, ...], int], key: tuple[object, ...], kept: int) -> int:
        """`key`'s number in `ids` (at most `kept` of them, then forgotten), drawn from one counter: never reused."""
        found = ids.get(key)
        if found is None:
            if len(ids) > kept:
                ids.clear()
            found = ids[key] = next(self._counter)
        return found


def memoised(record: NodeRecord, key: Hashable, compute: Callable[[NodeRecord], T]) -> T:
    """What `compute` makes of the node under `key` (its evaluation for a shape, its class for a policy), computed
    once until its usage changes: the state clears `NodeRecord.memo` then (`NodeRecord.remember` bounds it)."""
    hit: T | None = record.memo.get(key)  # type: ignore[assignment]
    if hit is None:
        hit = compute(record)
        record.remember(key, hit)
    return hit


class ShapeEvaluation:
    """What one filter reads of the nodes for its pod's shape: the free-share check and order key of a node, and
    for a single-kind pod its evaluation as the shape's ranking keeps it and its class under the policy."""

    __slots__ = ("alike", "class_key", "classify", "ids", "kind", "largest", "memo_key", "nodes", "order", "shares",
                 "signature")  # fmt: skip

    def __init__(
        self,
        state: ClusterState,
        shape: PodShape,
        order: NodeKey,
        memo_key: int,
        ids: MemoIds,
        kind: str = "",
        classify: Callable[[NodeRecord], Hashable] | None = None,
        class_key: int = 0,
    ) -> None:
        self.nodes = state.nodes
        self.signature = state.signature
        self.largest = shape.largest
        self.shares = shape.shares
        self.order = order
        self.memo_key = memo_key
        self.kind = kind
        """The pod's one kind ("" for a pod of several: only `free_share_check` is asked then)."""
        self.classify = classify
        """The policy's part of a node's class (`NodePolicy.order_class`); None: nodes are evaluated one by one."""
        self.class_key = class_key
        """Where a node's class is memoised."""
        self.ids = ids
        self.alike: dict[Hashable, Evaluation] = {}
        """Node class → its evaluation, this filter."""

    def free_share_check(self, record: NodeRecord) -> tuple[str | None, float]:
        """Why the node cannot take the shape by its devices' free shares (None: it may) and its order key. A cheap
        necessary condition that spares the vendor call for hopeless nodes; the reason stays exact about what is
        missing."""
        for kind, request in self.largest.items():
            free = self.signature(record, kind)
            share = self.shares(record, kind)
            if len(free) < request.count or free[-request.count] < share:
                enough = sum(1 for f in free if f >= share)
                return shortfall(request, kind, enough, len(record.views[kind].devices)), 0.0
        return None, self.order(record)

    def ranked(self, name: str) -> Evaluation:
        """The named node's evaluation as the shape's ranking keeps it: why it cannot take the pod, its order key,
        its group. A class is evaluated once per filter (its evaluation kept as it is), so that a ranking's rebuild
        (a new shape or workload profile) asks one node per class."""
        kind = self.kind
        record = self.nodes.get(name)
        if record is None or kind not in record.totals:
            return unregistered(record, (kind,)), 0.0, 0
        if self.classify is None:
            hit = memoised(record, self.memo_key, self.free_share_check)
            return hit[0], hit[1], record.totals[kind].group
        node_class = self.node_class(name)
        found = self.alike.get(node_class)
        if found is None:
            reason, key = self.free_share_check(record)
            found = self.alike[node_class] = (reason, key, record.totals[kind].group)
        return found

    def node_class(self, name: str) -> Hashable:
        """What `free_share_check` reads of the node: its free shares, device size and count, the policy's part;
        and the group its evaluation carries. As a small integer, memoised on the node until its usage changes; a
        node without the kind is a class of its own (its name)."""
        record = self.nodes.get(name)
        if record is None or self.kind not in record.totals:
            return name
        return memoised(record, self.class_key, self._class_number)

    def _class_number(self, record: NodeRecord) -> int:
        kind, classify = self.kind, self.classify
        assert classify is not None  # asked only when the policy classifies nodes
        totals = record.totals[kind]
        devices = len(record.views[kind].devices)
        return self.ids.node_class(
            (self.signature(record, kind), totals.largest, devices, totals.group, classify(record))
        )


class Candidates:
    """Orders a filter's candidate nodes and hands them out in batches."""

    def __init__(self, state: ClusterState, settings: ExtenderSettings) -> None:
        self.state = state
        self.settings = settings
        self.ids = MemoIds()
        self.rankings = Rankings(state)
        """Per pod shape (memo id), the named nodes evaluated and ordered (`hami.scheduler.ranking`)."""
        self._named: tuple[tuple[str, ...], frozenset[str]] = ((), frozenset())
        """The last names asked about as a tuple, and their set: kube-scheduler names the same nodes in every
        filter, and the extender's front hands them over as the same tuple (`hami.scheduler.server`)."""

    def batches(
        self,
        pod: Pod,
        requests: Mapping[str, list[ContainerRequest | None]],
        policy: SchedulingPolicy,
        selectors: Mapping[str, Selectors],
        node_names: Sequence[str],
        failed: dict[str, str],
    ) -> Iterator[list[NodeRecord]]:
        """The named nodes that may take the pod, in batches in the order they are to be fitted; why each of the
        others cannot is added to `failed`. The caller holds the state's lock while it reads the batches."""
        kinds = sorted(requests)
        largest = {k: max((r for r in requests[k] if r is not None), key=_size) for k in kinds}
        cpu_memory = (pod.cpu_request, pod.memory_request)
        node_policy = NODE_POLICIES[policy.node]
        shape = PodShape(tuple(kinds), largest, Shares(largest), cpu_memory, policy.workload)
        order = node_policy.order(self.state, shape)
        adjust = adjustment(self.state, node_policy, shape, selectors)
        memo_key = self.ids.memo(
            (
                policy.node,
                policy.workload.serial if policy.workload is not None else None,
                cpu_memory,
                tuple((k, r.count, r.memory, r.memory_percentage, r.cores) for k, r in sorted(largest.items())),
            )
        )
        size = self.settings.batch_size
        # A policy that takes the first feasible node in its order needs no more than that node fitted, and the
        # first candidate nearly always fits (it passed the free-share check); others compare a batch's scores.
        first = 1 if node_policy.takes_first_feasible else size
        if len(kinds) == 1:
            return self._ranked(shape, order, memo_key, node_policy, adjust, node_names, failed, first)
        evaluation = ShapeEvaluation(self.state, shape, order, memo_key, self.ids)
        return self._evaluated(evaluation, kinds, adjust, node_names, failed, first)

    def _ranked(
        self,
        shape: PodShape,
        order: NodeKey,
        memo_key: int,
        node_policy: NodePolicy,
        adjust: NodeKey | None,
        node_names: Sequence[str],
        failed: dict[str, str],
        first: int,
    ) -> Iterator[list[NodeRecord]]:
        """One kind: the shape's ranking, brought up to date with the nodes changed since its last filter."""
        (kind,) = shape.kinds
        nodes = self.state.nodes
        classify = node_policy.order_class(self.state, shape)
        class_key = self.ids.memo(("class", node_policy.name, kind))
        evaluation = ShapeEvaluation(self.state, shape, order, memo_key, self.ids, kind, classify, class_key)
        partition = None if classify is None else (class_key, evaluation.node_class)
        ranking = self.rankings.current(memo_key, evaluation.ranked, partition)
        ranked, reasons = ranking.ranked, ranking.failed
        named = self._name_set(node_names)
        if missing := named - ranked.keys():  # in C: nearly always empty where a kind's nodes are asked about
            unknown = unregistered(None, shape.kinds)
            failed.update({n: reasons.get(n) or unknown for n in node_names if n in missing})
        adjustments: dict[int, float] = {}
        if adjust is not None:
            adjustments = {g: adjust(nodes[n]) for g, n in ranking.representatives().items()}
        ordered = ranking.ordered(adjustments, named)
        if self.settings.pass_over_nodes_in_flight:
            ordered = _in_flight_last(ordered, nodes)
        return _ordered_batches(ordered, nodes, self.settings.batch_size, first)

    def _name_set(self, node_names: Sequence[str]) -> Set[str]:
        """`node_names` as a set, built once for the tuple asked about again and again."""
        if isinstance(node_names, (set, frozenset)):
            return node_names
        if not isinstance(node_names, tuple):
            return set(node_names)
        last, named = self._named
        if node_names is not last:
            named = frozenset(node_names)
            self._named = (node_names, named)
        return named

    def _evaluated(
        self,
        evaluation: ShapeEvaluation,
        kinds: Sequence[str],
        adjust: NodeKey | None,
        node_names: Sequence[str],
        failed: dict[str, str],
        first: int,
    ) -> Iterator[list[NodeRecord]]:
        """Several kinds: every named node evaluated (memoised on the node until it changes), then sorted."""
        candidates: list[tuple[float, str, NodeRecord]] = []
        node_of, append = self.state.nodes.get, candidates.append  # this loop runs once per node
        memo_key, check = evaluation.memo_key, evaluation.free_share_check
        for name in node_names:
            record = node_of(name)
            if record is None or any(k not in record.totals for k in kinds):
                failed[name] = unregistered(record, kinds)
                continue
            reason, key = memoised(record, memo_key, check)
            if reason is not None:
                failed[name] = reason
                continue
            if adjust is not None:
                key += adjust(record)
            append((key, name, record))
        size = self.settings.batch_size
        if self.settings.pass_over_nodes_in_flight and any(c[2].in_flight for c in candidates):
            later = [c for c in candidates if c[2].in_flight]
            now = [c for c in candidates if not c[2].in_flight]
            return itertools.chain(_batches(now, size, first) if now else (), _by_queue(later, size, first))
        return _batches(candidates, size, first)


def adjustment(
    state: ClusterState, node_policy: NodePolicy, shape: PodShape, selectors: Mapping[str, Selectors]
) -> NodeKey | None:
    """What a node's memoised order key leaves out, because it depends on other nodes (the policy's
    `NodePolicy.adjustment`) or on the pod's type selectors (nodes of models it does not select go last).
    None when nothing applies. Computed once per node group (model and device size) for single-kind pods."""
    scarcity = node_policy.adjustment(state, shape)
    typed = [(k, s) for k, s in selectors.items() if s.use_type or s.nouse_type]
    if scarcity is None and not typed:
        return None

    def adjusted(record: NodeRecord) -> float:
        value = scarcity(record) if scarcity else 0.0
        if any(s.refuses_model(record.totals[k].model) for k, s in typed):
            value += UNSELECTED_LAST  # the fit will refuse it: try the nodes of selected models first
        return value

    return adjusted


def unregistered(record: NodeRecord | None, kinds: Sequence[str]) -> str:
    """Why a node has none of the pod's device kinds to offer."""
    missing = [k for k in kinds if record is None or k not in record.views]
    dropped = [k for k in missing if record is not None and k in record.dropped]
    if dropped:
        return (
            f"{', '.join(dropped)} devices dropped: the node daemon stopped answering the handshake and the node's"
            " kubelet offers none of them (allocatable 0)"
        )
    return f"no {', '.join(missing)} devices registered"


def shortfall(request: ContainerRequest, kind: str, enough: int, total: int) -> str:
    """Why a node cannot serve `request`, in the words of the request."""
    many = f"{request.count} {kind} devices" if request.count > 1 else f"1 {kind} device"
    if request.memory_percentage is not None:
        memory = "a whole device" if request.memory_percentage >= 100 else f"{request.memory_percentage}% memory"
    else:
        memory = f"{request.memory} MiB"
    if (request.memory_percentage == 100 and request.cores >= 100) or request.cores == 0:
        wants = memory
    else:
        wants = f"{memory} and {request.cores}% cores"
    return f"needs {many} with {wants} free, {enough}/{total} of its devices have it"


def _size(request: ContainerRequest) -> tuple[int, int, int, int]:
    return (request.count, request.memory_percentage or 0, request.memory, request.cores)


def _batches(candidates: list[tuple[float, str, NodeRecord]], size: int, first: int) -> Iterator[list[NodeRecord]]:
    """Candidates in order of (key, name): `first` of them, then `size` at a time. The first batch costs O(n)
    (most pods stop there); the full sort is paid only when it holds no feasible node."""
    head = heapq.nsmallest(first, candidates)
    yield [c[2] for c in head]
    if len(candidates) <= first:
        return
    taken = {c[1] for c in head}
    rest = sorted(c for c in candidates if c[1] not in taken)
    for start in range(0, len(rest), size):
        yield [c[2] for c in rest[start : start + size]]


def _in_flight_last(
    ordered: Iterator[tuple[float, str]], nodes: Mapping[str, NodeRecord]
) -> Iterator[tuple[float, str]]:
    """The candidates in their order, but those with decisions awaiting their Allocate after all the others,
    fewest pods waiting first (`_by_queue`). Reading stops at the first batch with a feasible node, so the
    deferred ones cost nothing unless no other node fits."""
    later: list[tuple[float, str]] = []
    for candidate in ordered:
        if nodes[candidate[1]].in_flight:
            later.append(candidate)
        else:
            yield candidate
    later.sort(key=lambda c: len(nodes[c[1]].in_flight))  # stable: the policy's order among equals
    yield from later


def _by_queue(waiting: list[tuple[float, str, NodeRecord]], size: int, first: int) -> Iterator[list[NodeRecord]]:
    """Candidates with decisions in flight, fewest pods awaiting their Allocate first, then in order of (key,
    name). When every node has some (the filter outruns the binds), the policy's first node would otherwise collect
    the whole queue, and its binds, which take its lock one at a time, would wait for each other while the other
    nodes idle."""
    ordered = sorted(waiting, key=lambda c: (len(c[2].in_flight), c[0], c[1]))
    take, start = first, 0
    while start < len(ordered):
        yield [c[2] for c in ordered[start : start + take]]
        start, take = start + take, size


def _ordered_batches(
    ordered: Iterator[tuple[float, str]], nodes: Mapping[str, NodeRecord], size: int, first: int
) -> Iterator[list[NodeRecord]]:
    """Candidates already in order (a ranking's): `first` of them, then `size` at a time."""
    take = first
    while batch := [nodes[name] for _, name in itertools.islice(ordered, take)]:
        yield batch
        take = size
