"""Which XPUs of an 8-XPU Kunlunxin P800 node a container gets: HAMi v2.10's choice (``pkg/device/kunlun/topo.go``).

Owns the selection HAMi's Kunlunxin backends make among the devices a request fits, on the node's device list as HAMi
has it at that moment (sorted by the device policy: core's `hami.fitting.ChoiceContext.order`). The list's first four
positions are the left wing, the next four the right wing:

* 8 XPUs: all eight (indices 0-7) when all eight fit, else none;
* 1, 2 or 4 XPUs, when one wing has enough: the wing whose number of fitting XPUs is, in HAMi's order of preference,
  exactly the request (for one XPU: 1, then 3, 2, 4; for two: 2, 3, 4; for four: 4), its XPUs taken walking the list
  from that wing's first position; otherwise, across the wings:
* 2 XPUs: the first fitting pair (walking the list twice) that is linked across the wings (0-4, 1-5, 2-6, 3-7);
* 4 XPUs: with 4 or 5 fitting, the first of HAMi's six cross-wing groups (0-1-4-5, 2-3-6-7, 0-2-4-6, 1-3-5-7,
  0-3-4-7, 1-2-5-6) all fitting; with 6 fitting, such a group whose two left-over XPUs are linked (or, failing that,
  the last group that fits);
* any other count: none.

And the node score's bonus HAMi's whole-XPU backend gives (``ScoreNode``, `bonus`): a set of XPUs "bubbles" by wing (a
wing of 4 counts 0, of 1 counts 2, of 0, 2 or 3 counts 1; no XPU at all counts 1); the bonus is 3000, 2000, 1000 or 0
as the pod's XPUs bubble one less, as much, one more or two more than the node's busy ones (1000 otherwise).

Nothing here reads a device's memory or health: the fitter says which devices fit. Positions beyond a list's end (a
node of fewer than eight XPUs) fit nothing, where HAMi's loop would read past its list.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["CROSS_PAIRS", "CROSS_QUADS", "IN_WING_PAIRS", "bonus", "select"]

CROSS_PAIRS = ((0, 4), (1, 5), (2, 6), (3, 7))
IN_WING_PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7))
CROSS_QUADS = ((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6))
_ODD_ORDER = (1, 3, 2, 4)


def select(indices: Sequence[int], fits: Sequence[bool], count: int) -> list[int]:
    """The device indices chosen for `count` XPUs, or [] when HAMi's rules find none.

    :param indices: each listed device's index, in the list's order (HAMi's sorted device list).
    :param fits: whether each listed device fits the request."""
    left = sum(1 for ok in fits[:4] if ok)
    right = sum(1 for ok in fits[4:] if ok)
    if count == 8:
        return list(range(8)) if left + right == 8 else []
    if count not in (1, 2, 4):
        return []
    if left >= count or right >= count:
        for slots in range(count, 5):
            wanted = _ODD_ORDER[slots - 1] if count % 2 else slots
            if left == wanted:
                return _pick(indices, fits, 0, count)
            if right == wanted:
                return _pick(indices, fits, 4, count)
    return _across(indices, fits, count)


def _pick(indices: Sequence[int], fits: Sequence[bool], start: int, count: int) -> list[int]:
    chosen = [indices[t] for t in range(start, min(8, len(indices))) if fits[t]]
    return chosen[:count]


def _across(indices: Sequence[int], fits: Sequence[bool], count: int) -> list[int]:
    fitting = [i for i, ok in zip(indices, fits, strict=True) if ok]
    if count == 2:
        for a in fitting:
            for b in fitting:
                if a != b and ((a, b) in CROSS_PAIRS or (b, a) in CROSS_PAIRS):
                    return [a, b]
        return []
    if count != 4:
        return []
    have = set(fitting)
    if len(fitting) in (4, 5):
        return next((list(q) for q in CROSS_QUADS if have.issuperset(q)), [])
    if len(fitting) == 6:
        chosen: list[int] = []
        for quad in CROSS_QUADS:
            if have.issuperset(quad):
                chosen = list(quad)
                rest = have.difference(quad)
                if any(rest.issuperset(pair) for pair in (*CROSS_PAIRS, *IN_WING_PAIRS)):
                    return chosen
        return chosen
    return []


def _bubbles(indices: Sequence[int]) -> int:
    left = sum(1 for i in indices if i < 4)
    right = len(indices) - left
    if not left and not right:
        return 1
    return sum(0 if n == 4 else 2 if n == 1 else 1 for n in (left, right))


def bonus(busy: Sequence[int], taken: Sequence[int]) -> float:
    """HAMi's ``calcscore``: `busy` the indices of the node's XPUs in use before the pod, `taken` the pod's."""
    change = _bubbles(sorted(set(taken))) - _bubbles(sorted(set(busy)))
    return {-1: 3000.0, 0: 2000.0, 1: 1000.0, 2: 0.0}.get(change, 1000.0)
