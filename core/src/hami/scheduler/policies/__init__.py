"""Node-ordering policies, one module each behind `NodePolicy` (`base`): how the extender orders candidate
nodes before fitting them and which feasible node wins.

A new policy is one module with a `NodePolicy` subclass, named in `NODE_POLICIES` below (and in the names the
configuration accepts: `hami.model.SchedulingPolicy.node`, `hami.config`, `hami.scheduler.policy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from hami.scheduler.policies.base import NodeKey, NodePolicy, PodShape, Shares, node_share
from hami.scheduler.policies.best_fit import BestFit
from hami.scheduler.policies.binpack import Binpack
from hami.scheduler.policies.fragmentation_aware import FragmentationAware
from hami.scheduler.policies.spread import Spread
from hami.scheduler.policies.usage import Usage
from hami.scheduler.policies.workload import ObservedWorkload

__all__ = ["NODE_POLICIES", "NodeKey", "NodePolicy", "ObservedWorkload", "PodShape", "Shares", "node_share"]

NODE_POLICIES: Mapping[str, NodePolicy] = MappingProxyType(
    {p.name: p for p in (Binpack(), Spread(), BestFit(), FragmentationAware(), Usage())}
)
"""Name (as the configuration and `hami.io/node-scheduler-policy` spell it) → the policy."""
