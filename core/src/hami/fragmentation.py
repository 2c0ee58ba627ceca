"""Expected fragmentation of devices under a workload: the measure the `fragmentation-aware` policy minimises.

Owns the model of FGD (Weng et al., USENIX ATC 2023), computed so that it can run on every filter call. A
device's free capacity is its *free share* in thousandths (`0..1000`, the lesser of free memory and free cores).
The workload is a distribution over request shapes `(count, share)`: `count` devices of at least `share`
thousandths each. For one shape, the fragment of a node is the free share no such request could use: the free
share of every device with less than `share` free, provided `count` devices have at least `share` free;
otherwise all of the node's free share. A node's expected fragmentation is the probability-weighted sum over
shapes. A placement is good when it grows that sum least.

Speed: single-device shapes fold into one table indexed by a device's free share (so they cost one lookup per
device), and a node's value depends only on the sorted free shares of its devices, so results are memoised by
that signature: most nodes of a cluster share a handful of signatures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["FULL", "WorkloadProfile", "free_share", "request_share"]

FULL = 1000
"""A whole device, in thousandths."""


def free_share(devmem: int, usedmem: int, devcore: int, usedcores: int) -> int:
    """A device's free share in thousandths: the lesser of its free memory and free cores."""
    mem = (devmem - usedmem) * FULL // devmem if devmem > 0 else FULL
    cores = (devcore - usedcores) * FULL // devcore if devcore > 0 else FULL
    return max(0, min(mem, cores))


def request_share(memory: int, percentage: int | None, cores: int, devmem: int, devcore: int = 100) -> int:
    """What one device of a request takes, in thousandths of a device of `devmem` MiB and `devcore` cores."""
    mem = percentage * 10 if percentage is not None else (-(-memory * FULL // devmem) if devmem > 0 else 0)
    core = -(-cores * FULL // devcore) if devcore > 0 else 0
    return max(1, min(FULL, max(mem, core)))


@dataclass
class WorkloadProfile:
    """A distribution over request shapes, and the fragmentation measure it induces."""

    shapes: dict[tuple[int, int], float]
    """(count, share) → probability; shares in thousandths, probabilities summing to 1."""
    _single: list[float] = field(init=False, repr=False)
    _multi: list[tuple[int, int, float]] = field(init=False, repr=False)
    _memo: dict[tuple[tuple[int, ...], int, int], tuple[float, int]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        total = sum(self.shapes.values())
        if total <= 0:
            raise ValueError("a workload profile needs at least one request shape with positive weight")
        self.shapes = {shape: weight / total for shape, weight in self.shapes.items() if weight > 0}
        # single[f] = f × P(a single-device request needs more than f)
        above = [0.0] * (FULL + 2)
        for (count, share), p in self.shapes.items():
            if count == 1:
                above[share] += p
        tail = 0.0
        for f in range(FULL, -1, -1):
            tail_at_f = tail
            tail += above[f]
            above[f] = tail_at_f
        self._single = [f * above[f] for f in range(FULL + 1)]
        self._multi = [(count, share, p) for (count, share), p in self.shapes.items() if count > 1]
        self._memo = {}

    @classmethod
    def from_requests(cls, requests: Iterable[tuple[int, int]]) -> WorkloadProfile:
        """A profile from observed (count, share) requests, each weighing the same."""
        counts: dict[tuple[int, int], float] = {}
        for count, share in requests:
            if count > 0:
                key = (count, max(1, min(FULL, share)))
                counts[key] = counts.get(key, 0.0) + 1.0
        return cls(counts)

    def fragmentation(self, frees: Sequence[int]) -> float:
        """Expected fragmentation of a node whose devices have these free shares (thousandths)."""
        single = self._single
        value = 0.0
        total = 0
        for f in frees:
            value += single[f]
            total += f
        for count, share, p in self._multi:
            eligible = 0
            below = 0
            for f in frees:
                if f >= share:
                    eligible += 1
                else:
                    below += f
            value += p * (below if eligible >= count else total)
        return value

    def best_placement(self, frees: Sequence[int], count: int, share: int) -> tuple[float, int]:
        """The growth of fragmentation when `count` devices give `share` each, placed as well as possible,
        and the free share of the device to take first (for a single-device request: the device to take).

        Returns (inf, -1) when the request does not fit. `frees` must be sorted (the node's signature).
        """
        key = (tuple(frees), count, share)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if len(self._memo) > 200_000:
            self._memo.clear()
        before = self.fragmentation(frees)
        best = (float("inf"), -1)
        if count == 1:
            for f in sorted(set(frees)):
                if f < share:
                    continue
                after = list(frees)
                after[after.index(f)] = f - share
                delta = self.fragmentation(after) - before
                if delta < best[0] - 1e-12:
                    best = (delta, f)
        else:
            eligible = sorted(f for f in frees if f >= share)
            if len(eligible) >= count:
                after = list(frees)
                for f in eligible[:count]:
                    after[after.index(f)] = f - share
                best = (self.fragmentation(after) - before, eligible[0])
        self._memo[key] = best
        return best
