"""Topology-aware device choice: the building block for vendors whose devices are linked unevenly.

Owns the choice among *usable* devices when the pod's device policy includes ``topology-aware`` and the node
publishes pairwise link scores (higher is better connected; NVIDIA's ``hami.io/node-nvidia-score``, the same
shape suits any vendor with NVLink-, HCCS- or MetaXLink-style fabrics):

* one device: the device whose removal keeps the best links free, i.e. the least connected one, so that
  well-linked pairs stay available for pods that need several devices (`least_connected`);
* N devices: the best-connected set, the one whose pairwise scores add up highest (`best_connected`),
  exhaustively while the number of sets stays small and greedily beyond.

Ties keep the order the device policy (binpack, spread) gives, so topology refines the policy instead of
replacing it. With ``numa`` in the chain as well, a set is taken within one NUMA node when one can hold it.

`TopologyFitter` is `hami.fitting.ShareFitter` with this choice plugged in through the share fitter's
extension point (`ShareFitter.choose_devices`): feasibility, accounting, selectors and refusal reasons are the
share fitter's own, only the pick among usable devices changes. Nothing here modifies the node views, and a
node without link scores is served exactly as `ShareFitter` would serve it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from itertools import combinations
from math import comb

from hami.codec import AnnotationError, decode_link_scores
from hami.fitting import Candidate, ChoiceContext, ShareFitter
from hami.model import ContainerRequest, DeviceKind, DeviceUsage, NodeView

__all__ = ["TOPOLOGY_POLICY", "LinkScores", "TopologyFitter", "best_connected", "least_connected", "set_score"]

log = logging.getLogger(__name__)

TOPOLOGY_POLICY = "topology-aware"
EXHAUSTIVE_LIMIT = 20_000
"""Above this many candidate sets, `best_connected` grows a set greedily instead of trying them all."""

LinkScores = Mapping[str, Mapping[str, int]]
"""Device id → peer device id → link score (higher is better connected)."""


def _pair(scores: LinkScores, a: str, b: str) -> int:
    return scores.get(a, {}).get(b, 0)


def set_score(scores: LinkScores, devices: Sequence[str]) -> int:
    """The sum of the link scores of every pair in `devices`."""
    return sum(_pair(scores, a, b) for i, a in enumerate(devices) for b in devices[i + 1 :])


def least_connected(candidates: Sequence[str], scores: LinkScores) -> str:
    """The candidate whose links to the other candidates add up lowest (the first such, in order)."""
    if not candidates:
        raise ValueError("no candidate devices")
    totals = [sum(_pair(scores, c, o) for o in candidates if o != c) for c in candidates]
    return candidates[totals.index(min(totals))]


def best_connected(candidates: Sequence[str], count: int, scores: LinkScores) -> tuple[str, ...]:
    """The `count` candidates whose pairwise link scores add up highest (the first such set, in order)."""
    if count <= 0:
        return ()
    if count >= len(candidates):
        return tuple(candidates)
    if count == 1:
        return (candidates[0],)
    if comb(len(candidates), count) <= EXHAUSTIVE_LIMIT:
        best: tuple[str, ...] = ()
        best_score = -1
        for subset in combinations(candidates, count):  # in candidate order: the first maximum wins ties
            score = set_score(scores, subset)
            if score > best_score:
                best, best_score = subset, score
        return best
    # greedy: the best pair, then the device adding the most to what is chosen
    pairs = combinations(range(len(candidates)), 2)
    i, j = max(pairs, key=lambda p: (_pair(scores, candidates[p[0]], candidates[p[1]]), -p[0], -p[1]))
    chosen = [candidates[i], candidates[j]]
    rest = [c for c in candidates if c not in chosen]
    while len(chosen) < count:
        gains = [sum(_pair(scores, c, x) for x in chosen) for c in rest]
        pick = rest[gains.index(max(gains))]
        chosen.append(pick)
        rest.remove(pick)
    order = {c: n for n, c in enumerate(candidates)}
    return tuple(sorted(chosen, key=order.__getitem__))


@lru_cache(maxsize=4096)
def _decode(value: str, annotation: str) -> Mapping[str, Mapping[str, int]]:
    try:
        return decode_link_scores(value, annotation)
    except AnnotationError as exc:
        log.warning("ignoring link scores: %s", exc)
        return {}


def scores_from_annotation(annotation: str) -> Callable[[NodeView], LinkScores]:
    """A link-score reader for `TopologyFitter`: the view's `link_scores`, else the node annotation
    `annotation` decoded (and cached by value, so a node's scores are decoded once, not per pod)."""

    def read(node: NodeView) -> LinkScores:
        if node.link_scores:
            return node.link_scores
        value = node.annotations.get(annotation)
        return _decode(value, annotation) if value else {}

    return read


class TopologyFitter(ShareFitter):
    """`ShareFitter` choosing among usable devices by link scores when the policy asks for ``topology-aware``.

    `links` reads a node's scores (see `scores_from_annotation`); without it, the view's `link_scores` are used.
    """

    def __init__(
        self,
        kind: DeviceKind,
        *,
        links: Callable[[NodeView], LinkScores] | None = None,
        extra_filter: Callable[[DeviceUsage, ContainerRequest], str | None] | None = None,
        numa_bind: bool = False,
    ) -> None:
        super().__init__(kind, extra_filter=extra_filter, numa_bind=numa_bind)
        self.links = links or (lambda node: node.link_scores)

    def choose_devices(
        self, candidates: Sequence[Candidate], count: int, context: ChoiceContext
    ) -> Sequence[Candidate]:
        policy = context.policy
        if TOPOLOGY_POLICY not in policy.device or len(candidates) <= count:
            return super().choose_devices(candidates, count, context)
        scores = self.links(context.node)
        if not scores:
            return super().choose_devices(candidates, count, context)
        ranked = super().choose_devices(candidates, len(candidates), context)  # all of them, in the policy's order
        by_id = {item.device.id: item for item in ranked}
        ids = list(by_id)
        if count == 1:
            return [by_id[least_connected(ids, scores)]]
        pools = [ids]
        if "numa" in policy.device or self.numa_bind:
            groups: dict[int, list[str]] = {}
            for item in ranked:
                groups.setdefault(item.device.numa, []).append(item.device.id)
            whole = [g for g in groups.values() if len(g) >= count]
            if whole:
                pools = whole
        sets = [best_connected(pool, count, scores) for pool in pools]
        best = max(sets, key=lambda s: set_score(scores, s))  # first maximum: the policy's favourite pool
        return [by_id[d] for d in best]
