"""Fitting NVIDIA requests: shared GPUs through core's building blocks, MIG GPUs through `mig`.

Owns the NVIDIA rules layered on `hami.topology.TopologyFitter` (core's `ShareFitter` with the
topology-aware choice):

* ``nvidia.com/vgpu-mode`` (``hami-core``, ``mig``, ``mps``, or a comma list) limits the GPUs to those
  registered in one of the modes; without it a pod may use any GPU, shared ones first and MIG instances when
  no shared GPU on the node fits it;
* ``nvidia.com/numa-bind: "true"`` puts all GPUs of a container on one NUMA node, or refuses the node; core's
  ``hami.io/numa-alignment`` (`hami.numaalign`: ``strict`` requires it, ``best-effort`` prefers it) applies to
  shared GPUs through `ShareFitter` and to MIG GPUs here, by the same rule;
* ``hami.io/gpu-scheduler-policy: topology-aware`` picks, among usable GPUs, the least connected one for a
  one-GPU container and the best-connected set for several, from the node's ``hami.io/node-nvidia-score``;
* a GPU in MIG mode serves a container with one MIG instance: the smallest allowed profile whose memory covers
  the request and has a free placement (a request for the whole GPU gets the largest profile on an idle GPU).
  The grant written in the pod's device string is the profile's memory and compute share, as HAMi writes it,
  and the fit carries the reservations (GPU, profile, placement per container and device) as the pod
  annotation ``hami.io/vgpu-mig-allocations``, which the scheduler writes with the placement and the node
  side creates the instances from. A pod placed on shared GPUs instead gets that annotation emptied when an
  earlier decision left one on it.

MIG occupancy is what the node side reports (``hami.io/node-nvidia-mig-instances``) plus the reservations of
the pods counted on the node (`NodeView.pods`), so a reservation counts from the moment the filter makes it
until the pod is gone, whether or not its instance exists yet. A GPU on which more containers are counted
than occupancy can locate (pods placed without a reservation, by an older scheduler) takes no new MIG instance
until the node reports them (refused with a reason saying so). Type and UUID selectors, the device cordon,
health and slot accounting apply to MIG GPUs as to shared ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hami.codec import MigReservation, encode_mig_allocations
from hami.fitting import CORDON_ANNOTATION, Selectors, ShareFitter, node_score
from hami.islands import islands_from_links
from hami.model import (
    ContainerDevice,
    ContainerPlacement,
    ContainerRequest,
    DeviceKind,
    DeviceUsage,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.numaalign import NUMA_ALIGNMENT_ANNOTATION, NumaAlignment, NumaAlignmentError, numa_alignment
from hami.topology import TOPOLOGY_POLICY, TopologyFitter, scores_from_annotation
from hami_vendor_nvidia.discovery import LINK_SCORE_ANNOTATION, NVLINK_SCORE
from hami_vendor_nvidia.mig import (
    MIG_ALLOCATIONS_ANNOTATION,
    MigProfile,
    Occupancy,
    Placement,
    profiles_of,
    select_profile,
)

__all__ = [
    "nvlink_islands",
    "MODE_ANNOTATION",
    "MODES",
    "NUMA_BIND_ANNOTATION",
    "MigChoice",
    "NvidiaFitter",
    "numa_bind",
    "requested_modes",
]

MODE_ANNOTATION = "nvidia.com/vgpu-mode"
NUMA_BIND_ANNOTATION = "nvidia.com/numa-bind"
MODES = ("hami-core", "mig", "mps")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_PLAIN = frozenset({"", "hami-core"})


def requested_modes(pod: Pod) -> frozenset[str] | None:
    """The modes the pod accepts (``nvidia.com/vgpu-mode``), or None for any."""
    raw = pod.annotations.get(MODE_ANNOTATION)
    if raw is None or not raw.strip():
        return None
    return frozenset(m.strip() for m in raw.split(",") if m.strip())


def numa_bind(pod: Pod) -> bool:
    """``nvidia.com/numa-bind`` parsed as Go's strconv.ParseBool does (HAMi's rule)."""
    return pod.annotations.get(NUMA_BIND_ANNOTATION, "").strip() in _TRUE


def _mode(usage: DeviceUsage) -> str:
    return usage.device.mode or "hami-core"


@dataclass(frozen=True, slots=True)
class MigChoice:
    """One MIG instance reserved for one device of one container."""

    container_index: int
    device_index: int
    gpu_uuid: str
    profile: MigProfile
    placement: Placement

    def reservation(self) -> MigReservation:
        """The choice as one entry of ``hami.io/vgpu-mig-allocations``."""
        return MigReservation(
            self.container_index, self.device_index, self.gpu_uuid, self.profile.name,
            self.placement.start, self.placement.size,
        )  # fmt: skip


class NvidiaFitter:
    """Fits one pod's NVIDIA requests onto candidate nodes; one instance per hook call."""

    def __init__(self, kind: DeviceKind, pod: Pod, policy: SchedulingPolicy) -> None:
        self.kind = kind
        self.pod = pod
        self.modes = requested_modes(pod)
        self.numa_bind = numa_bind(pod)
        self.alignment: NumaAlignment | None = None
        self.alignment_error = ""
        """Why the pod's ``hami.io/numa-alignment`` cannot be read (MIG GPUs refuse it; shared GPUs, core does)."""
        try:
            self.alignment = numa_alignment(pod.annotations)
        except NumaAlignmentError as exc:
            self.alignment_error = str(exc)
        self.policy = policy
        self.selectors = Selectors(kind, pod)
        self.shared: ShareFitter = ShareFitter(kind, numa_bind=self.numa_bind)
        if TOPOLOGY_POLICY in self.policy.device:
            self.shared = TopologyFitter(
                kind, links=scores_from_annotation(LINK_SCORE_ANNOTATION), numa_bind=self.numa_bind
            )
        self.mig_choices: dict[str, list[MigChoice]] = {}
        """Node name → the MIG instances reserved by the last fit on that node (the reservation annotation)."""
        stale = pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION)
        self._clear: Mapping[str, str] = {MIG_ALLOCATIONS_ANNOTATION: ""} if stale else {}
        """What a fit without MIG writes: the reservations of an earlier decision emptied, if the pod has some."""

    def fit_nodes(self, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView]) -> list[NodeFit]:
        return [self.fit_node(requests, node) for node in nodes]

    def fit_node(self, requests: Sequence[ContainerRequest | None], node: NodeView) -> NodeFit:
        modes = self.modes
        on_node = {u.device.mode for u in node.devices}
        if on_node <= _PLAIN and (modes is None or "hami-core" in modes):  # the common case: shared GPUs only
            return self._fit_shared(requests, node)
        usable = [u for u in node.devices if _mode(u) != "mig" and (modes is None or _mode(u) in modes)]
        has_mig = "mig" in on_node and (modes is None or "mig" in modes)
        shared: NodeFit | None = None
        if usable:
            shared = self._fit_shared(requests, node.model_copy(update={"devices": usable}))
            if shared.fits or not has_mig:
                return shared
        if has_mig:
            mig = self.fit_mig(requests, node)
            if mig.fits or shared is None:
                return mig
            return NodeFit(node=node.name, reason=f"{shared.reason}; MIG: {mig.reason}")
        wanted = ", ".join(sorted(modes or ()))
        return NodeFit(node=node.name, reason=f"no GPU in {wanted} mode")

    def _fit_shared(self, requests: Sequence[ContainerRequest | None], node: NodeView) -> NodeFit:
        fit = self.shared.fit_node(self.pod, requests, node, self.policy, self.selectors)
        if fit.fits and self.numa_bind:
            fit = self._bound_to_numa(fit, node, requests)
        if fit.fits and self._clear:
            fit = fit.model_copy(update={"pod_annotations": self._clear})
        return fit

    def _bound_to_numa(self, fit: NodeFit, node: NodeView, requests: Sequence[ContainerRequest | None]) -> NodeFit:
        numa = {u.device.id: u.device.numa for u in node.devices}
        names = [c.name for c in self.pod.all_containers]
        for index, devices in enumerate(fit.placement or ()):
            if len({numa.get(d.uuid) for d in devices}) > 1:
                request = requests[index]
                count = request.count if request is not None else len(devices)
                who = f"container {names[index]}" if index < len(names) and len(requests) > 1 else "pod"
                return NodeFit(
                    node=node.name,
                    reason=f"{who}: {NUMA_BIND_ANNOTATION} asks for {count} GPUs on one NUMA node, "
                    "and no NUMA node has that many usable",
                )
        return fit

    # ------------------------------------------------------------------------------------------ MIG

    def fit_mig(
        self,
        requests: Sequence[ContainerRequest | None],
        node: NodeView,
        pods: Iterable[Mapping[str, str]] | None = None,
    ) -> NodeFit:
        """Fit the pod onto the node's MIG GPUs. `pods` are the annotations of the pods counted on the node
        (default: those of `node.pods`); their ``hami.io/vgpu-mig-allocations`` reservations are occupied.
        A fit carries its own reservations as that annotation."""
        if pods is None:
            pods = [p.annotations for p in node.pods.values()]
        occupancy = Occupancy.of_node(node.annotations, pods)
        cordoned = {p.strip() for p in node.annotations.get(CORDON_ANNOTATION, "").split(",") if p.strip()}
        state = {u.device.id: [u.used, u.usedmem, u.usedcores] for u in node.devices}
        names = [c.name for c in self.pod.all_containers]
        placement: list[ContainerPlacement] = []
        choices: list[MigChoice] = []
        for index, request in enumerate(requests):
            if request is None:
                placement.append(())
                continue
            chosen, reason = self._fit_mig_container(index, request, node, occupancy, cordoned, state)
            if chosen is None:
                who = f"container {names[index]}" if index < len(names) and len(requests) > 1 else "pod"
                return NodeFit(node=node.name, reason=f"{who}: {reason}")
            placement.append(tuple(c for c, _ in chosen))
            choices.extend(m for _, m in chosen)
        self.mig_choices[node.name] = choices
        reserved = encode_mig_allocations(c.reservation() for c in choices)
        return NodeFit(
            node=node.name,
            placement=tuple(placement),
            score=node_score(node, placement, self.pod.run_order),
            pod_annotations={MIG_ALLOCATIONS_ANNOTATION: reserved},
        )

    def _fit_mig_container(
        self,
        index: int,
        request: ContainerRequest,
        node: NodeView,
        occupancy: Occupancy,
        cordoned: set[str],
        state: dict[str, list[int]],
    ) -> tuple[list[tuple[ContainerDevice, MigChoice]] | None, str]:
        refusals: Counter[str] = Counter()
        usable: list[tuple[DeviceUsage, MigProfile, Placement]] = []
        mutex = "mutex" in self.policy.device
        for usage in node.devices:
            if _mode(usage) != "mig":
                continue
            reason, pick = self._mig_refusal(usage, request, occupancy, cordoned, state, mutex)
            if reason:
                refusals[reason] += 1
            elif pick is not None:
                usable.append((usage, *pick))
        total = sum(1 for u in node.devices if _mode(u) == "mig")
        if self.alignment_error:
            return None, self.alignment_error
        if len(usable) < request.count:
            detail = ", ".join(f"{n} {why}" for why, n in sorted(refusals.items(), key=lambda kv: (-kv[1], kv[0])))
            need = f"needs {request.count} MIG instance{'s' if request.count > 1 else ''} on distinct GPUs"
            return None, f"{need}, {len(usable)}/{total} MIG GPUs usable" + (f" ({detail})" if detail else "")
        chosen = self._choose_mig(usable, request.count, state)
        if chosen is None:
            asks = NUMA_BIND_ANNOTATION if self.numa_bind else f"{NUMA_ALIGNMENT_ANNOTATION}: strict"
            return None, (
                f"{asks} asks for {request.count} MIG GPUs on one NUMA node, and no NUMA node has that many usable"
            )
        out = []
        for position, (usage, profile, where) in enumerate(chosen):
            gpu = usage.device.id
            occupancy.add(gpu, where)
            s = state[gpu]
            s[0] += 1
            s[1] += profile.memory
            s[2] += profile.core
            device = ContainerDevice(
                uuid=gpu, type=self.kind.common_word, usedmem=profile.memory, usedcores=profile.core
            )
            out.append((device, MigChoice(index, position, gpu, profile, where)))
        return out, ""

    def _mig_refusal(
        self,
        usage: DeviceUsage,
        request: ContainerRequest,
        occupancy: Occupancy,
        cordoned: set[str],
        state: dict[str, list[int]],
        mutex: bool,
    ) -> tuple[str | None, tuple[MigProfile, Placement] | None]:
        d = usage.device
        if not d.health:
            return "unhealthy", None
        if d.id in cordoned:
            return "cordoned", None
        selected = self.selectors.refuses(usage)
        if selected:
            return selected, None
        used, usedmem, usedcores = state[d.id]
        if used >= d.count:
            return "no free slot", None
        if (mutex or request.cores >= 100) and used > 0:
            return "not idle (exclusive use asked)", None
        if usage.used > occupancy.known(d.id):
            return "MIG reservations not yet reported by the node", None
        profiles = profiles_of(d)
        if not profiles:
            return "no MIG profile allowed", None
        whole = request.memory_percentage == 100 and not request.memory
        pick = select_profile(profiles, occupancy.on(d.id), request.memory_on(d), largest=whole)
        if pick is None:
            return "no free MIG placement large enough", None
        profile = pick[0]
        if profile.memory > d.devmem - usedmem or profile.core > d.devcore - usedcores:
            return "insufficient memory", None
        return None, pick

    def _choose_mig(
        self, usable: list[tuple[DeviceUsage, MigProfile, Placement]], count: int, state: dict[str, list[int]]
    ) -> list[tuple[DeviceUsage, MigProfile, Placement]] | None:
        binpack = "binpack" in self.policy.device or "best-fit" in self.policy.device

        def order(item: tuple[DeviceUsage, MigProfile, Placement]) -> tuple[float, int, str]:
            usage, profile, _ = item
            d = usage.device
            share = (state[d.id][2] + profile.core) / d.devcore if d.devcore else 1.0
            return (-share if binpack else share, d.index, d.id)

        ranked = sorted(usable, key=order)
        if (self.numa_bind or self.alignment is not None) and count > 1:
            groups: dict[int, list[tuple[DeviceUsage, MigProfile, Placement]]] = {}
            for item in ranked:
                if item[0].device.numa >= 0 or self.numa_bind:  # an unknown NUMA node aligns nothing
                    groups.setdefault(item[0].device.numa, []).append(item)
            whole = [g[:count] for g in groups.values() if len(g) >= count]
            if whole:
                return whole[0]
            if self.numa_bind or self.alignment is NumaAlignment.STRICT:
                return None
        return ranked[:count]


_LINKS = scores_from_annotation(LINK_SCORE_ANNOTATION)


def nvlink_islands(node: NodeView) -> dict[str, str]:
    """The node's NVLink islands (`hami_device_islands`): GPUs joined by at least one NVLink (a pair scoring
    `NVLINK_SCORE` or more in HAMi's link scores, directly or through other GPUs); a GPU with none is left out."""
    return islands_from_links([d.id for d in node.devices], _LINKS(node), NVLINK_SCORE)
