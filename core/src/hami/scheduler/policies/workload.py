"""The request mix the fragmentation-aware policy plans for, learned from the pods the filter sees."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from hami.fragmentation import CPU_BUCKET, FULL, MEMORY_BUCKET, WorkloadProfile
from hami.model import ContainerRequest

__all__ = ["ObservedWorkload"]


class ObservedWorkload:
    """The request mix the fragmentation-aware policy plans for: the last `window` device requests seen by filter,
    each with its pod's CPU and memory requests and type selector, unless a profile is given (the simulator gives
    the trace's). Every `refresh` observations the mix is recounted, and the profile replaced only when it has
    moved by more than `drift` (total variation distance): a new profile costs every node a fresh evaluation."""

    def __init__(
        self, window: int = 2000, fixed: WorkloadProfile | None = None, refresh: int = 200, drift: float = 0.05
    ) -> None:
        self.fixed = fixed
        self.window = window
        self.refresh = refresh
        self.drift = drift
        self._recent: deque[tuple[int, int, int, int, tuple[str, ...]]] = deque(maxlen=window)
        self._profile: WorkloadProfile | None = None
        self._seen = 0
        self._counted_at = 0

    def observe(
        self,
        requests: Mapping[str, list[ContainerRequest | None]],
        cpu: int = 0,
        memory: int = 0,
        models: Mapping[str, tuple[str, ...]] | None = None,
    ) -> None:
        """Count one pod: its device requests per kind, its CPU (millicores) and memory (MiB) requests, and the
        device models each kind's type selector accepts (none: any). CPU and memory are rounded up to the policy's
        buckets, which is all it distinguishes, so that alike pods make one task."""
        if self.fixed is not None:
            return
        cpu = -(-cpu // CPU_BUCKET) * CPU_BUCKET
        memory = -(-memory // MEMORY_BUCKET) * MEMORY_BUCKET
        for kind, per_container in requests.items():
            accepted = (models or {}).get(kind, ())
            for r in per_container:
                if r is not None:
                    share = r.memory_percentage * 10 if r.memory_percentage is not None else max(r.cores * 10, 1)
                    self._recent.append((r.count, min(share, FULL), cpu, memory, accepted))
        self._seen += 1

    def profile(self) -> WorkloadProfile | None:
        """The profile to plan for; recounted here, when a policy asks, so that other policies pay nothing."""
        if self.fixed is not None:
            return self.fixed
        if self._recent and (self._profile is None or self._seen - self._counted_at >= self.refresh):
            self._counted_at = self._seen
            recounted = WorkloadProfile.from_requests(self._recent)
            current = self._profile.tasks if self._profile is not None else {}
            moved = sum(abs(p - current.get(t, 0.0)) for t, p in recounted.tasks.items()) + sum(
                p for t, p in current.items() if t not in recounted.tasks
            )
            if self._profile is None or moved / 2 > self.drift:
                self._profile = recounted
        return self._profile
