"""The kubelet's GetPreferredAllocation for a pod annotated ``hami.io/numa-alignment``: the devices the scheduler
placed, or, under ``strict``, a refusal when the kubelet offers none of them.

The kubelet asks GetPreferredAllocation just before Allocate, with the device IDs it may hand the container. With
its Topology Manager on (``single-numa-node``, ``restricted``), those are the IDs on the NUMA node where it put the
container's CPUs; its answer becomes the IDs it records for the container and aligns its CPUs with. This daemon's
Allocate serves the scheduler's placement whatever IDs the kubelet gives (`hami.node.allocate`), so:

* without the annotation the answer is today's (`hami.node.devices.preferred_ids`: distinct cards first);
* with ``best-effort`` or ``strict``, the answer is one offered ID on each device the scheduler placed the
  container on (the IDs the kubelet must include first), so the kubelet's record and its CPU alignment follow the
  devices the container really gets;
* when the kubelet offers no ID on some placed device (its Topology Manager keeps the container to another NUMA
  node), ``strict`` refuses: the kubelet fails the pod's admission with the message, rather than start it beside
  CPUs of another NUMA node; ``best-effort`` logs it and answers as without the annotation (HAMi's best-effort
  keeps the kubelet's own choice too). HAMi after v2.10 can instead ask its scheduler to move the placement onto the
  offered devices (its ``/refit``); this project does not (docs/hami-compatibility.md).

A pod whose annotation cannot be read, or which cannot be found, gets today's answer: Allocate, which follows,
says what is wrong. `PlacedPreference` is the daemon's `PreferFunction`: it finds the pod as Allocate does
(`Allocator.pending_placements`: the node lock, then the pod; two reads) and asks `aligned_preference`, a pure
function, per container.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from hami.errors import HamiError
from hami.model import ContainerPlacement, Pod
from hami.node.devices import AdvertisedDevice, PreferredRequest
from hami.numaalign import NUMA_ALIGNMENT_ANNOTATION, NumaAlignment, NumaAlignmentError, numa_alignment

__all__ = ["MisalignedError", "PlacedPreference", "aligned_preference"]

Pending = Callable[[str], tuple[Pod, list[tuple[str, ContainerPlacement]]] | None]
"""Device kind → the pod the next Allocate serves and its containers still to serve, as (name, placement)."""

log = logging.getLogger(__name__)


class MisalignedError(HamiError):
    """``strict``: the kubelet offers none of the IDs of a device the scheduler placed the container on."""


def aligned_preference(
    pod: Pod,
    container: str,
    placement: ContainerPlacement,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    physical: Mapping[str, str],
    numa: Mapping[str, int],
) -> list[str] | None:
    """The IDs to prefer for the container `container` of `pod`, placed on `placement`; None for today's answer.

    `physical` maps an advertised ID to its device's UUID, `numa` an advertised ID to its NUMA node (-1 unknown).

    :raises MisalignedError: the pod asks ``strict`` and some placed device has no ID among `available`."""
    try:
        mode = numa_alignment(pod.annotations)
    except NumaAlignmentError as exc:
        log.warning("pod %s/%s: %s; answering as without it", pod.namespace, pod.name, exc)
        return None
    if mode is None or len(placement) != size:
        return None
    chosen = list(dict.fromkeys(must_include))[:size]
    covered = {physical.get(i, i) for i in chosen}
    missing: list[str] = []
    for device in dict.fromkeys(d.uuid for d in placement):
        if device in covered:
            continue
        offered = next((i for i in available if physical.get(i, i) == device and i not in chosen), None)
        if offered is None:
            missing.append(device)
        else:
            chosen.append(offered)
            covered.add(device)
    if not missing:  # IDs the kubelet must include off the placement (its own earlier choice): its answer stands
        return chosen if len(chosen) == size else None
    who = f"pod {pod.namespace}/{pod.name} container {container}"
    placed = ", ".join(missing)
    offered_numa = sorted({numa.get(i, -1) for i in available} - {-1})
    nodes = f"node{'s' if len(offered_numa) > 1 else ''} {', '.join(map(str, offered_numa))}"
    where = f"devices on NUMA {nodes}" if offered_numa else "other devices"
    if mode is NumaAlignment.BEST_EFFORT:
        log.info(
            "%s: the kubelet offers only %s, not the placed %s; best-effort keeps the kubelet's choice",
            who, where, placed,
        )  # fmt: skip
        return None
    raise MisalignedError(
        f"{who} asks {NUMA_ALIGNMENT_ANNOTATION}: strict, and the kubelet offers only {where} (where its Topology "
        f"Manager put the container's CPUs), none on {placed}, which the scheduler placed it on: not starting it "
        "misaligned. Create the pod again so the scheduler places it anew (with best-effort it would start misaligned)"
    )


class PlacedPreference:
    """The node daemon's GetPreferredAllocation beyond the device list (`hami.node.plugin.PreferFunction`)."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending

    def __call__(
        self, kind: str, requests: Sequence[PreferredRequest], devices: Mapping[str, AdvertisedDevice]
    ) -> list[list[str] | None]:
        """Per container request of the kubelet (the pod's next containers, in order) the IDs to prefer, or None.

        :raises MisalignedError: see `aligned_preference`."""
        answers: list[list[str] | None] = [None] * len(requests)
        found = self.pending(kind)
        if found is None or NUMA_ALIGNMENT_ANNOTATION not in found[0].annotations:
            return answers
        pod, containers = found
        physical = {i: d.device for i, d in devices.items()}
        numa = {i: d.numa for i, d in devices.items()}
        for at, (request, (name, placement)) in enumerate(zip(requests, containers, strict=False)):
            answers[at] = aligned_preference(
                pod, name, placement, request.available, request.must_include, request.size, physical, numa
            )
        return answers
