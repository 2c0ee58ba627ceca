"""MIG geometry: profiles, placements, occupancy and the choice of a profile and placement for a request.

Owns HAMi v2.10's dynamic-MIG model (protocol.md section 3): a GPU in MIG mode publishes the profiles it allows
(``migProfiles`` in its register entry: name, memory, compute share, slice count and the legal placements NVML
reports), and a request is served by the *smallest* allowed profile whose memory covers it and that has a free
placement which overlaps no instance already there or already reserved. A placement occupies the half-open
memory-slice interval ``[start, start + size)``.

Which free placement is taken matters for what fits later: `MigLayout.rank` keeps whole halves of the card
free for as long as possible, putting small instances at the edges of the half that the profile table uses
least, so a later 3g or 4g still has room (HAMi's balanced packing, expressed again here).

Occupancy comes from two places (`Occupancy`): the MIG instances the node side reports in the node annotation
``hami.io/node-nvidia-mig-instances`` (what exists on the hardware), and the reservations written in the
``hami.io/vgpu-mig-allocations`` annotations of the pods counted on the node (decoded once per value, as the
same pods are seen by every fit). Pure functions: no NVML, no cluster access.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hami.codec import AnnotationError, decode_mig_allocations
from hami.model import Device

__all__ = [
    "MIG_ALLOCATIONS_ANNOTATION",
    "MIG_INSTANCES_ANNOTATION",
    "MigLayout",
    "MigProfile",
    "Occupancy",
    "Placement",
    "encode_instances",
    "profiles_of",
    "reserved_placements",
    "select_profile",
]

log = logging.getLogger(__name__)

MIG_ALLOCATIONS_ANNOTATION = "hami.io/vgpu-mig-allocations"
"""Pod annotation (HAMi v2.10): the MIG reservations of a pod, completed by the node side."""
MIG_INSTANCES_ANNOTATION = "hami.io/node-nvidia-mig-instances"
"""Node annotation written by this project's node side: every MIG instance that exists on the node's GPUs."""


@dataclass(frozen=True, slots=True, order=True)
class Placement:
    """Where a GPU instance sits: `size` memory slices from `start`."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size

    def overlaps(self, other: Placement) -> bool:
        if not self.size or not other.size:
            return False
        return self.start < other.end and other.start < self.end


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile as a GPU registers it: what one instance gives and where instances may go."""

    name: str
    memory: int
    """MiB of one instance, as NVML reports it."""
    core: int
    """Percent of the GPU's compute one instance takes (its compute slices over the GPU's, rounded down)."""
    slices: int
    placements: tuple[Placement, ...]

    @property
    def footprint(self) -> int:
        return max((p.size for p in self.placements), default=0)

    def to_register(self) -> dict[str, Any]:
        """The object HAMi v2.10 writes in ``migProfiles`` of ``hami.io/node-nvidia-register``."""
        return {
            "name": self.name,
            "memoryMB": self.memory,
            "core": self.core,
            "sliceCount": self.slices,
            "placements": [{"start": p.start, "size": p.size} for p in self.placements],
        }

    @classmethod
    def from_register(cls, obj: Any) -> MigProfile:
        """Read one ``migProfiles`` entry. :raises ValueError: it is not a profile object."""
        if not isinstance(obj, Mapping):
            raise ValueError(f"a MIG profile must be a JSON object, got {obj!r}")
        folded = {str(k).lower(): v for k, v in obj.items()}
        name = folded.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"a MIG profile needs a name: {dict(obj)}")
        placements = []
        for raw in folded.get("placements") or ():
            if not isinstance(raw, Mapping):
                raise ValueError(f"MIG profile {name}: a placement must be {{'start':…,'size':…}}, got {raw!r}")
            p = {str(k).lower(): v for k, v in raw.items()}
            start, size = p.get("start"), p.get("size")
            if not isinstance(start, int) or not isinstance(size, int) or start < 0 or size <= 0:
                raise ValueError(f"MIG profile {name}: placement {dict(raw)} needs a start >= 0 and a size > 0")
            placements.append(Placement(start, size))
        numbers = {key: folded.get(key, 0) for key in ("memorymb", "core", "slicecount")}
        for key, value in numbers.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"MIG profile {name}: {key} must be a non-negative integer, got {value!r}")
        return cls(name, numbers["memorymb"], numbers["core"], numbers["slicecount"], tuple(placements))


_profiles_cache: dict[int, tuple[Device, tuple[MigProfile, ...]]] = {}


def profiles_of(device: Device) -> tuple[MigProfile, ...]:
    """The MIG profiles a device registered, smallest first (memory, then slices, then name).

    Malformed entries are skipped with a warning. Cached per device object: the scheduler keeps a node's
    `Device` objects until the node's register annotation changes.
    """
    hit = _profiles_cache.get(id(device))
    if hit is not None and hit[0] is device:
        return hit[1]
    profiles = []
    for raw in device.mig_profiles:
        try:
            profiles.append(MigProfile.from_register(raw))
        except ValueError as exc:
            log.warning("device %s: ignoring a MIG profile: %s", device.id, exc)
    ordered = tuple(sorted(profiles, key=lambda p: (p.memory, p.slices, p.name)))
    if len(_profiles_cache) > 8192:
        _profiles_cache.clear()
    _profiles_cache[id(device)] = (device, ordered)
    return ordered


# --------------------------------------------------------------------------------------------------------
# Choosing a placement
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Region:
    start: int
    end: int

    def contains(self, p: Placement) -> bool:
        return p.size > 0 and p.start >= self.start and p.end <= self.end

    def free(self, occupied: Iterable[Placement]) -> bool:
        whole = Placement(self.start, self.end - self.start)
        return not any(whole.overlaps(o) for o in occupied)


class MigLayout:
    """The placement geometry of one GPU, from its profile table.

    The card is split at its midpoint unless some placement other than the full-card one straddles it; the
    half holding fewer placements is *reserved* for the profiles that fill a half. A candidate placement is
    better when afterwards more regions stay empty, when it does not put a half-sized instance outside the
    reserved half (or a small one inside it), when it sits farther toward the card's edge, and finally when
    it starts lower.
    """

    def __init__(self, profiles: Sequence[MigProfile]) -> None:
        slices = max((p.end for prof in profiles for p in prof.placements), default=0)
        self.slices = slices
        whole = [_Region(0, slices)]
        mid = slices // 2
        split = slices >= 2 and not any(
            p.start < mid < p.end for prof in profiles for p in prof.placements if 0 < p.size < slices
        )
        self.regions = [_Region(0, mid), _Region(mid, slices)] if split else whole
        counts = [sum(r.contains(p) for prof in profiles for p in prof.placements) for r in self.regions]
        self.reserved = max(i for i, c in enumerate(counts) if c == min(counts))

    def _score(self, occupied: Sequence[Placement], candidate: Placement) -> tuple[int, int, int, int]:
        after = [*occupied, candidate]
        empty = sum(1 for r in self.regions if r.free(after))
        mismatch = 0
        edge = 0
        if len(self.regions) > 1:
            for i, region in enumerate(self.regions):
                if not region.contains(candidate):
                    continue
                fills = candidate.size == region.end - region.start
                mismatch = int(fills != (i == self.reserved))
                edge = region.end - candidate.end if i == 0 else candidate.start - region.start
        return (-empty, mismatch, -edge, candidate.start)

    def rank(self, occupied: Sequence[Placement], profile: MigProfile) -> list[Placement]:
        """The free placements of `profile`, best first."""
        free = [p for p in profile.placements if p.size and not any(p.overlaps(o) for o in occupied)]
        return sorted(free, key=lambda p: self._score(occupied, p))


@lru_cache(maxsize=1024)
def _layout(profiles: tuple[MigProfile, ...]) -> MigLayout:
    return MigLayout(profiles)


def select_profile(
    profiles: Sequence[MigProfile], occupied: Sequence[Placement], memory: int, *, largest: bool = False
) -> tuple[MigProfile, Placement] | None:
    """The smallest profile whose memory covers `memory` MiB and that has a free placement, with the best
    such placement; or None. With `largest`, the biggest profile (a request for the whole GPU)."""
    candidates = tuple(profiles)
    if not candidates:
        return None
    layout = _layout(candidates)
    ordered = sorted(candidates, key=lambda p: (p.memory, p.slices, p.name))
    if largest:
        ordered = [max(ordered, key=lambda p: (p.memory, p.slices))]
    for profile in ordered:
        if profile.memory < memory and not largest:
            continue
        ranked = layout.rank(occupied, profile)
        if ranked:
            return profile, ranked[0]
    return None


# --------------------------------------------------------------------------------------------------------
# Occupancy
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReportedInstance:
    """A MIG instance as the node side reports it in `MIG_INSTANCES_ANNOTATION`."""

    gpu_uuid: str
    profile: str
    placement: Placement
    mig_uuid: str = ""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "gpuUUID": self.gpu_uuid,
            "profile": self.profile,
            "placement": {"start": self.placement.start, "size": self.placement.size},
        }
        if self.mig_uuid:
            obj["migUUID"] = self.mig_uuid
        if self.gpu_instance_id is not None:
            obj["gpuInstanceID"] = self.gpu_instance_id
        if self.compute_instance_id is not None:
            obj["computeInstanceID"] = self.compute_instance_id
        return obj


def encode_instances(instances: Iterable[ReportedInstance]) -> str:
    """The value of `MIG_INSTANCES_ANNOTATION`: a compact JSON array, GPUs and placements in order."""
    ordered = sorted(instances, key=lambda i: (i.gpu_uuid, i.placement))
    return json.dumps([i.to_json() for i in ordered], separators=(",", ":"))


@lru_cache(maxsize=4096)
def decode_instances(value: str) -> dict[str, tuple[Placement, ...]]:
    """GPU UUID → occupied placements, from `MIG_INSTANCES_ANNOTATION`. A malformed value occupies nothing
    (and is logged once): the scheduler then sees the GPU as holding only what pods reserved."""
    try:
        data = json.loads(value) if value.strip() else []
        if not isinstance(data, list):
            raise ValueError("expected a JSON array")
        out: dict[str, list[Placement]] = {}
        for raw in data:
            gpu = raw["gpuUUID"]
            placement = raw["placement"]
            start, size = int(placement["start"]), int(placement["size"])
            if not isinstance(gpu, str) or start < 0 or size <= 0:
                raise ValueError(f"bad instance {raw!r}")
            out.setdefault(gpu, []).append(Placement(start, size))
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("annotation %s is malformed, ignoring it: %s", MIG_INSTANCES_ANNOTATION, exc)
        return {}
    return {gpu: tuple(sorted(ps)) for gpu, ps in out.items()}


@lru_cache(maxsize=4096)
def reserved_placements(value: str) -> tuple[tuple[str, Placement], ...]:
    """(GPU UUID, placement) of every reservation in a pod's `MIG_ALLOCATIONS_ANNOTATION`. A malformed value
    reserves nothing (and is logged once per value)."""
    try:
        reservations = decode_mig_allocations(value, MIG_ALLOCATIONS_ANNOTATION)
    except AnnotationError as exc:
        log.warning("ignoring a pod's MIG reservations: %s", exc)
        return ()
    return tuple((r.gpu_uuid, Placement(r.start, r.size)) for r in reservations)


@dataclass
class Occupancy:
    """What is taken on each MIG GPU of one node: instances the node reported, reservations of pods, and what
    the pod being placed has taken so far."""

    reported: Mapping[str, tuple[Placement, ...]] = field(default_factory=dict)
    reported_known: bool = False
    """The node publishes its instances (the annotation exists), so an empty list means an empty GPU."""
    reserved: dict[str, list[Placement]] = field(default_factory=dict)

    @classmethod
    def of_node(cls, annotations: Mapping[str, str], pods: Iterable[Mapping[str, str]] = ()) -> Occupancy:
        """Occupancy from a node's annotations and (when given) the annotations of the pods counted on it."""
        value = annotations.get(MIG_INSTANCES_ANNOTATION)
        occupancy = cls(decode_instances(value) if value is not None else {}, value is not None)
        for pod_annotations in pods:
            raw = pod_annotations.get(MIG_ALLOCATIONS_ANNOTATION)
            if raw:
                for gpu_uuid, placement in reserved_placements(raw):
                    occupancy.add(gpu_uuid, placement)
        return occupancy

    def add(self, gpu_uuid: str, placement: Placement) -> None:
        taken = self.reserved.setdefault(gpu_uuid, [])
        if placement not in taken and placement not in self.reported.get(gpu_uuid, ()):
            taken.append(placement)

    def on(self, gpu_uuid: str) -> list[Placement]:
        return [*self.reported.get(gpu_uuid, ()), *self.reserved.get(gpu_uuid, ())]

    def known(self, gpu_uuid: str) -> int:
        """How many instances the scheduler can locate on the GPU."""
        return len(self.on(gpu_uuid))

    def copy(self) -> Occupancy:
        return Occupancy(self.reported, self.reported_known, {k: list(v) for k, v in self.reserved.items()})
