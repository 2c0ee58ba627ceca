"""The `spread` node policy: HAMi's node score, the emptiest node first, and the vendors' lowest score wins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami.scheduler.policies.binpack import Binpack
from hami.scheduler.state import NodeRecord

__all__ = ["Spread"]


class Spread(Binpack):
    name = "spread"
    sign = 1.0

    def choose(self, batch: Sequence[NodeRecord], feasible: Mapping[str, float]) -> str:
        return min(sorted(feasible), key=lambda n: feasible[n])

    def priority(self, share: float) -> int:
        return round(10 * (1 - share))
