"""Scheduling policies: the cluster defaults and the per-pod overrides HAMi reads from annotations.

Owns parsing `hami.io/node-scheduler-policy` (`binpack`|`spread`), `hami.io/gpu-scheduler-policy` (a device
policy or a comma chain of them) and `hami.io/device-scoring-weights` (`slot=<int>,core=<int>,memory=<int>`).
A malformed override is refused with a message naming the annotation and the legal values, rather than
silently ignored: the user asked for something and should learn it was not understood.
"""

from __future__ import annotations

from collections.abc import Mapping

from hami.errors import HamiError
from hami.model import SchedulingPolicy

__all__ = [
    "DEVICE_POLICIES",
    "DEVICE_POLICY_ANNOTATION",
    "NODE_POLICY_ANNOTATION",
    "PolicyError",
    "WEIGHTS_ANNOTATION",
    "policy_for",
]

NODE_POLICY_ANNOTATION = "hami.io/node-scheduler-policy"
DEVICE_POLICY_ANNOTATION = "hami.io/gpu-scheduler-policy"
WEIGHTS_ANNOTATION = "hami.io/device-scoring-weights"
NODE_POLICIES = ("binpack", "spread", "best-fit", "fragmentation-aware", "usage")
DEVICE_POLICIES = (
    "binpack", "spread", "topology-aware", "numa", "mutex", "best-fit", "fragmentation-aware", "usage"
)  # fmt: skip
WEIGHT_KEYS = ("slot", "core", "memory")


class PolicyError(HamiError, ValueError):
    """A policy annotation the scheduler cannot read."""


def policy_for(annotations: Mapping[str, str], default: SchedulingPolicy) -> SchedulingPolicy:
    """The policy for a pod: `default` with the pod's annotations applied."""
    node = default.node
    device = default.device
    weights = dict(default.weights)
    if NODE_POLICY_ANNOTATION in annotations:
        value = annotations[NODE_POLICY_ANNOTATION].strip()
        if value not in NODE_POLICIES:
            raise PolicyError(f"{NODE_POLICY_ANNOTATION}: {value!r} is not one of {', '.join(NODE_POLICIES)}")
        node = value  # type: ignore[assignment]
        if value in ("best-fit", "fragmentation-aware", "usage") and DEVICE_POLICY_ANNOTATION not in annotations:
            device = (value,)
    if DEVICE_POLICY_ANNOTATION in annotations:
        chain = tuple(p.strip() for p in annotations[DEVICE_POLICY_ANNOTATION].split(",") if p.strip())
        unknown = [p for p in chain if p not in DEVICE_POLICIES]
        if unknown or not chain:
            raise PolicyError(
                f"{DEVICE_POLICY_ANNOTATION}: {annotations[DEVICE_POLICY_ANNOTATION]!r} is not a comma list of "
                f"{', '.join(DEVICE_POLICIES)}"
            )
        device = chain
    if WEIGHTS_ANNOTATION in annotations:
        for part in annotations[WEIGHTS_ANNOTATION].split(","):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in WEIGHT_KEYS or not value.isdigit():
                raise PolicyError(
                    f"{WEIGHTS_ANNOTATION}: {part.strip()!r} is not <slot|core|memory>=<non-negative integer> "
                    "(e.g. slot=1,core=2,memory=1)"
                )
            weights[key] = int(value)
    return SchedulingPolicy(node=node, device=device, weights=weights)
