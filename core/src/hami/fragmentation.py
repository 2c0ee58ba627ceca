"""Expected fragmentation of a node under a workload: the measure the `fragmentation-aware` policy minimises.

Owns the model of FGD (Weng et al., USENIX ATC 2023), computed fast enough to run on every filter call.

A device's free capacity is its *free share* in thousandths (`0..1000`, the lesser of free memory and free
cores). The workload is a distribution over tasks: `count` devices of at least `share` thousandths each,
plus the CPU (millicores) and memory (MiB) the task needs on the node, and the device models it accepts (HAMi's
type selector: a case-insensitive part of the model name; none means any). For one task, the fragment of a node
is the free device share that task could not use: everything, when the node lacks the task's CPU or memory,
has a device model the task does not accept, or has fewer than `count` devices with `share` free; otherwise
the free share of the devices with less than `share` free. A node's expected fragmentation is the
probability-weighted sum over tasks; a placement is good when it grows that sum least. Nodes whose CPU and
memory are unknown count every task as fitting them.

FGD's measure sees CPU only once a node is short of it for some task; by then the GPU-heavy nodes have given their
CPU to CPU-hungry tasks and their last devices are stranded. So a node's fragmentation here also counts the device
share its free CPU cannot feed at the workload's average CPU per device share (`STRANDING_WEIGHT`): CPU-hungry
tasks, and tasks without devices, go where CPU is plentiful for the devices left.

Fragmentation alone does not see supply: a task any model can serve fragments a scarce model's node exactly as
much as a plentiful one's, so it may use up the few devices that tasks restricted to that model need, and those
tasks then fail while plenty of other capacity is free. `model_pressure` measures that per model: the share of
the expected device demand that only a subset of the models can serve, divided by that subset's share of the
free capacity (above 1: restricted demand outpaces what is left). The policy charges a placement on a model its
pressure times the share it takes, so flexible tasks go where restricted ones cannot.

Speed: per (CPU, memory) bucket and device model of a node, the single-device tasks fold into one table indexed by a
device's free share, so a node costs one lookup per device plus a term per multi-device shape; placements
are memoised by the node's signature (its sorted free shares and buckets), which most nodes share.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FULL", "WorkloadProfile", "free_share", "request_share"]

FULL = 1000
"""A whole device, in thousandths."""
CPU_BUCKET = 1000
"""Millicores per bucket of free CPU."""
MEMORY_BUCKET = 1024
"""MiB per bucket of free memory."""
STRANDING_WEIGHT = 1.0
"""Weight of device share stranded for lack of CPU in a node's fragmentation: one stranded thousandth counts as one
fragment thousandth (2.0 measured the same on the openb default trace, 0.5 slightly worse)."""
MIN_AVAILABLE = 1e-3
"""Floor of a model group's share of the free capacity in `model_pressure`, so a used-up group's pressure stays
finite."""
UNKNOWN = 1 << 40
"""Bucket standing for unknown (unlimited) CPU or memory."""
_PROFILE_SERIALS = itertools.count()


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
class _Weights:
    """The profile seen from one (CPU, memory) bucket: what only the device shares decide."""

    single: list[float]
    """single[f] = f × P(a single-device task that fits the node's CPU and memory needs more than f)."""
    multi: list[tuple[int, int, float]]
    """(count, share, P(task fits CPU and memory)) for multi-device shapes."""
    unfit: float
    """P(a task does not fit the node's CPU or memory): all free share is a fragment for it."""
    feedable: float
    """Device share (thousandths) the node's free CPU can feed at the workload's CPU per share; inf if unknown."""


@dataclass
class WorkloadProfile:
    """A distribution over tasks, and the fragmentation measure it induces."""

    tasks: dict[tuple[int, int, int, int, tuple[str, ...]], float]
    """(count, share, cpu millicores, memory MiB, accepted models) → probability (normalised on construction)."""
    _shapes: dict[tuple[int, int], list[tuple[int, int, tuple[str, ...], float]]] = field(init=False, repr=False)
    _weights: dict[tuple[int, int, str], _Weights] = field(init=False, repr=False)
    _tables: dict[tuple[int, int, str], tuple[list[float], list[tuple[int, int, float]], float]] = field(
        init=False, repr=False
    )
    _cpu_levels: list[int] = field(init=False, repr=False)
    _memory_levels: list[int] = field(init=False, repr=False)
    _memo: dict[tuple[object, ...], tuple[float, int]] = field(init=False, repr=False)
    _restricted: dict[tuple[str, ...], float] = field(init=False, repr=False)
    _groups: dict[frozenset[str], list[tuple[frozenset[str], float]]] = field(init=False, repr=False)
    serial: int = field(init=False, repr=False, compare=False)
    """A number no other profile of this process has: what memos keyed by the profile hold (its `id` may be
    reused once it is freed, and would then stand for another profile's evaluations)."""

    def __post_init__(self) -> None:
        self.serial = next(_PROFILE_SERIALS)
        total = sum(self.tasks.values())
        if total <= 0:
            raise ValueError("a workload profile needs at least one task with positive weight")
        self.tasks = {
            (*task, ())[:5] if len(task) == 4 else task: weight / total
            for task, weight in self.tasks.items()
            if weight > 0
        }
        self._shapes = {}
        for (count, share, cpu, memory, models), p in self.tasks.items():
            self._shapes.setdefault((count, share), []).append((cpu, memory, tuple(m.lower() for m in models), p))
        self._weights = {}
        self._tables = {}
        self._cpu_levels = sorted({cpu for _, _, cpu, _, _ in self.tasks})
        self._memory_levels = sorted({memory for _, _, _, memory, _ in self.tasks})
        self._memo = {}
        demand = sum(count * share * p for (count, share, _, _, _), p in self.tasks.items())
        self._restricted = {}
        for (count, share, _, _, models), p in self.tasks.items():
            if models:
                key = tuple(sorted({m.lower() for m in models}))
                self._restricted[key] = self._restricted.get(key, 0.0) + count * share * p / demand
        self._groups = {}
        self._cpu_per_share = sum(cpu * p for (_, _, cpu, _, _), p in self.tasks.items()) / demand

    @classmethod
    def from_requests(cls, requests: Iterable[tuple[Any, ...]]) -> WorkloadProfile:
        """A profile from observed requests, `(count, share)`, `(count, share, cpu, memory)` or
        `(count, share, cpu, memory, models)`, equally weighted."""
        counts: dict[tuple[int, int, int, int, tuple[str, ...]], float] = {}
        for request in requests:
            count, share, cpu, memory, models = (*request, 0, 0, (), ())[:5]
            if count > 0:
                key = (count, max(1, min(FULL, share)), cpu, memory, tuple(models))
                counts[key] = counts.get(key, 0.0) + 1.0
        return cls(counts)

    @staticmethod
    def bucket(cpu_free: int | None, memory_free: int | None) -> tuple[int, int]:
        return (
            UNKNOWN if cpu_free is None else max(0, cpu_free) // CPU_BUCKET,
            UNKNOWN if memory_free is None else max(0, memory_free) // MEMORY_BUCKET,
        )

    def _weights_for(self, bucket: tuple[int, int], model: str) -> _Weights:
        key = (*bucket, model)
        found = self._weights.get(key)
        if found is not None:
            return found
        cpu_cap = bucket[0] * CPU_BUCKET
        memory_cap = bucket[1] * MEMORY_BUCKET
        # Which tasks fit depends on the caps only through the largest task CPU and memory within them: buckets
        # alike in that share the tables, the costly part.
        levels = (
            bisect.bisect_right(self._cpu_levels, cpu_cap),
            bisect.bisect_right(self._memory_levels, memory_cap),
            model,
        )
        tables = self._tables.get(levels)
        if tables is None:
            tables = self._tables[levels] = self._tables_for(cpu_cap, memory_cap, model.lower())
        single, multi, fitting = tables
        feedable = float("inf") if bucket[0] == UNKNOWN or self._cpu_per_share <= 0 else cpu_cap / self._cpu_per_share
        weights = _Weights(single, multi, max(0.0, 1.0 - fitting), feedable)
        if len(self._weights) > 50_000:
            self._weights.clear()
        self._weights[key] = weights
        return weights

    def _tables_for(
        self, cpu_cap: int, memory_cap: int, name: str
    ) -> tuple[list[float], list[tuple[int, int, float]], float]:
        """The single-device table, the multi-device shapes and P(fit) for nodes with these caps and model."""
        need_more = [0.0] * (FULL + 2)  # need_more[s] = P(fitting single-device task with share s)
        multi = []
        fitting = 0.0
        for (count, share), tasks in self._shapes.items():
            p = sum(
                w
                for cpu, memory, models, w in tasks
                if cpu <= cpu_cap and memory <= memory_cap and (not models or any(m in name for m in models))
            )
            fitting += p
            if count == 1:
                need_more[share] += p
            elif p:
                multi.append((count, share, p))
        single = [0.0] * (FULL + 1)
        tail = 0.0
        for f in range(FULL, -1, -1):
            single[f] = f * tail  # tasks needing more than f: shares f+1..FULL
            tail += need_more[f]
        return single, multi, fitting

    def fragmentation(
        self, frees: Sequence[int], cpu_free: int | None = None, memory_free: int | None = None, model: str = ""
    ) -> float:
        """Expected fragmentation (thousandths of a device) of a node with these device free shares."""
        return self._fragmentation(frees, self._weights_for(self.bucket(cpu_free, memory_free), model))

    @staticmethod
    def _fragmentation(frees: Sequence[int], w: _Weights) -> float:
        single = w.single
        value = 0.0
        total = 0
        for f in frees:
            value += single[f]
            total += f
        for count, share, p in w.multi:
            eligible = 0
            below = 0
            for f in frees:
                if f >= share:
                    eligible += 1
                else:
                    below += f
            value += p * (below if eligible >= count else total)
        return value + w.unfit * total + STRANDING_WEIGHT * max(0.0, total - w.feedable)

    def model_pressure(self, free: Mapping[str, int]) -> dict[str, float]:
        """Per device model (keys of `free`, the cluster's free share per model): the expected demand of tasks
        restricted to a subset of the models present, per unit of that subset's share of the free capacity,
        summed over the subsets the model belongs to. Empty when no task is restricted."""
        if not self._restricted:
            return {}
        present = frozenset(free)
        groups = self._groups.get(present)
        if groups is None:
            merged: dict[frozenset[str], float] = {}
            for selectors, demand in self._restricted.items():
                accepted = frozenset(m for m in present if any(s in m.lower() for s in selectors))
                if accepted and len(accepted) < len(present):
                    merged[accepted] = merged.get(accepted, 0.0) + demand
            groups = self._groups[present] = list(merged.items())
        total = sum(max(0, f) for f in free.values())
        pressure: dict[str, float] = {}
        if total <= 0:
            return pressure
        for accepted, demand in groups:
            available = max(sum(max(0, free[m]) for m in accepted) / total, MIN_AVAILABLE)
            for model in accepted:
                pressure[model] = pressure.get(model, 0.0) + demand / available
        return pressure

    def best_placement(
        self,
        frees: Sequence[int],
        count: int,
        share: int,
        *,
        cpu_free: int | None = None,
        memory_free: int | None = None,
        cpu: int = 0,
        memory: int = 0,
        model: str = "",
    ) -> tuple[float, int]:
        """How much the node's expected fragmentation grows when a task of `count` devices × `share` (and
        `cpu`, `memory`) is placed as well as possible, and the free share of the device to take (the first
        one, for several). (inf, -1) when it does not fit. `frees` must be sorted (the node's signature)."""
        before_bucket = self.bucket(cpu_free, memory_free)
        after_bucket = self.bucket(
            None if cpu_free is None else cpu_free - cpu, None if memory_free is None else memory_free - memory
        )
        key = (tuple(frees), count, share, before_bucket, after_bucket, model)
        hit = self._memo.get(key)
        if hit is not None:
            return hit
        if len(self._memo) > 300_000:
            self._memo.clear()
        before = self._fragmentation(frees, self._weights_for(before_bucket, model))
        after_weights = self._weights_for(after_bucket, model)
        best = (float("inf"), -1)
        if count == 1:
            for f in sorted(set(frees)):
                if f < share:
                    continue
                after = list(frees)
                after[after.index(f)] = f - share
                delta = self._fragmentation(after, after_weights) - before
                if delta < best[0] - 1e-12:
                    best = (delta, f)
        else:
            eligible = sorted(f for f in frees if f >= share)
            if len(eligible) >= count:
                after = list(frees)
                for f in eligible[:count]:
                    after[after.index(f)] = f - share
                best = (self._fragmentation(after, after_weights) - before, eligible[0])
        self._memo[key] = best
        return best
