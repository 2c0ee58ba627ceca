"""Allocation on the node: making a recorded placement real, and undoing it when the pod is gone.

Owns what happens between the scheduler's decision and the container's start, inside the kubelet's Allocate:

* a shared (hami-core) GPU needs the container's accounting directory on the host
  (``<hookPath>/vgpu/containers/<pod uid>_<container>``, emptied and made world-writable as HAMi does); the
  placement is kept as it is;
* a GPU in MIG mode needs its instance: the reservation is read from the pod's ``hami.io/vgpu-mig-allocations``
  (container index, device index, GPU, profile, placement) when the scheduler wrote one; otherwise the profile
  is the allowed one whose memory and compute share the placement records, at the best free placement on the
  hardware (the same ranking the scheduler uses). The GPU instance is created at exactly that placement with
  one compute instance spanning it, through NVML; an instance already there for the same reservation (a
  repeated Allocate) is reused. The placement handed on names the MIG device by its UUID, and the pod's
  reservation annotation, completed with the instances' runtime identity (`reservations_after`), goes back to
  the node daemon to write. When one device of a container fails, the instances this call created are
  destroyed again.

`release` destroys the MIG instances of a finished pod (those this node created for it, and those its
reservation annotation names with a runtime identity) and removes its accounting directories; it tolerates a
pod that was never allocated or was already released, and keeps for a later call an instance NVML refuses to
destroy because processes still run on it.

`reservations_after` gives the pod's ``hami.io/vgpu-mig-allocations`` completed with ``migUUID``,
``gpuInstanceID`` and ``computeInstanceID``: what `allocate` returns for the daemon to write back, so that a
restarted daemon still finds (and `release` destroys) the instances by their recorded identity.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hami.codec import AnnotationError, MigReservation, decode_mig_allocations, encode_mig_allocations
from hami.errors import HamiError
from hami.model import Allocation, ContainerDevice, ContainerPlacement, Pod
from hami_vendor_nvidia.discovery import register_profiles
from hami_vendor_nvidia.edits import host_dirs
from hami_vendor_nvidia.mig import MIG_ALLOCATIONS_ANNOTATION, MigProfile, Placement, select_profile
from hami_vendor_nvidia.node import NodeRuntime, Realized, runtime_for
from hami_vendor_nvidia.nvml import ERROR_IN_USE, MigInstance, Nvml, NvmlError
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = ["allocate", "release", "reservations_after"]

log = logging.getLogger("hami_vendor_nvidia")


def _reservations(pod: Pod) -> list[MigReservation]:
    raw = pod.annotations.get(MIG_ALLOCATIONS_ANNOTATION)
    if not raw:
        return []
    try:
        return decode_mig_allocations(raw)
    except AnnotationError as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: {exc}") from None


def allocate(
    settings: NvidiaSettings, pod: Pod, container_index: int, devices: ContainerPlacement
) -> Allocation | None:
    """The placement to hand to `container_edits` (MIG devices named by their MIG UUID), with the completed
    reservation annotation to write when the pod has one; None when the placement stays as recorded."""
    if not devices:
        return None
    runtime = runtime_for(settings)
    realized = [d.uuid.startswith("MIG-") for d in devices]
    mig = [i for i, d in enumerate(devices) if not realized[i] and _in_mig_mode(runtime, d.uuid)]
    if len(mig) + sum(realized) < len(devices):
        _prepare_cache_dir(settings, pod, container_index)
    if not mig:
        return None
    with runtime.lock:
        nvml = runtime.session()
        if nvml is None:
            raise HamiError("cannot create MIG instances: NVML is not available on this node")
        reserved = [r for r in _reservations(pod) if r.container_index == container_index]
        made: list[MigInstance] = []
        out = list(devices)
        try:
            for position in mig:
                device = devices[position]
                instance, new = _realize(runtime, nvml, pod, container_index, position, device, reserved)
                if new:
                    made.append(instance)
                out[position] = device.model_copy(update={"uuid": instance.uuid})
        except (NvmlError, HamiError) as exc:
            for instance in made:
                _destroy(runtime, nvml, instance)
            if isinstance(exc, HamiError):
                raise
            raise HamiError(f"pod {pod.namespace}/{pod.name}: creating its MIG instance failed: {exc}") from None
        completed = reservations_after(settings, pod)
        annotations = {MIG_ALLOCATIONS_ANNOTATION: completed} if completed is not None else {}
        return Allocation(devices=tuple(out), pod_annotations=annotations)


def _in_mig_mode(runtime: NodeRuntime, uuid: str) -> bool:
    info = runtime.known_gpus().get(uuid)
    return info is not None and info.mig_enabled


def _prepare_cache_dir(settings: NvidiaSettings, pod: Pod, container_index: int) -> None:
    host_dirs(settings).prepare(pod, container_index)


def _allowed(runtime: NodeRuntime, uuid: str) -> tuple[MigProfile, ...]:
    info = runtime.known_gpus()[uuid]
    return register_profiles(info.mig_profiles, runtime.settings.allowed_mig_profiles(info.name))


def _realize(
    runtime: NodeRuntime,
    nvml: Nvml,
    pod: Pod,
    container_index: int,
    position: int,
    device: ContainerDevice,
    reserved: Sequence[MigReservation],
) -> tuple[MigInstance, bool]:
    index = runtime.gpu_index(device.uuid)
    if index is None:
        raise HamiError(f"GPU {device.uuid} of pod {pod.namespace}/{pod.name} is not on this node")
    profiles = {p.name: p for p in _allowed(runtime, device.uuid)}
    existing = nvml.mig_instances(index)
    records = runtime.created.setdefault(pod.uid or pod.name, [])
    mine = [r.instance for r in records]
    reservation = next(
        (r for r in reserved if r.device_index == position and r.gpu_uuid == device.uuid),
        None,
    )
    if reservation is not None:
        profile = profiles.get(reservation.profile)
        if profile is None:
            raise HamiError(
                f"pod {pod.namespace}/{pod.name} reserves MIG profile {reservation.profile} on GPU {device.uuid}, "
                f"which this GPU does not allow (allowed: {', '.join(sorted(profiles)) or 'none'})"
            )
        where = Placement(reservation.start, reservation.size)
        if where not in profile.placements:
            raise HamiError(
                f"pod {pod.namespace}/{pod.name}: placement {where.start}+{where.size} is not legal for "
                f"{profile.name} on GPU {device.uuid}"
            )
        for instance in existing:
            if (instance.start, instance.size) != (where.start, where.size):
                continue
            ours = instance in mine or (reservation.mig_uuid and reservation.mig_uuid == instance.uuid)
            if ours and instance.profile == profile.name and instance.uuid:
                return instance, False
            raise HamiError(
                f"pod {pod.namespace}/{pod.name}: placement {where.start}+{where.size} of GPU {device.uuid} is taken "
                f"by MIG instance {instance.uuid or instance.gpu_instance_id} ({instance.profile})"
            )
    else:
        for record in records:
            same = (record.container_index, record.device_index) == (container_index, position)
            if same and record.instance.gpu_uuid == device.uuid and record.instance in existing:
                return record.instance, False  # a repeated Allocate for the same container
        candidates = [p for p in profiles.values() if p.memory == device.usedmem] or [
            p for p in profiles.values() if p.memory >= device.usedmem
        ]
        pick = select_profile(candidates, [Placement(m.start, m.size) for m in existing], device.usedmem)
        if pick is None:
            raise HamiError(
                f"pod {pod.namespace}/{pod.name}: no free MIG placement on GPU {device.uuid} for {device.usedmem} MiB"
            )
        profile, where = pick
    info = next(p for p in runtime.known_gpus()[device.uuid].mig_profiles if p.name == profile.name)
    instance = nvml.create_mig(index, info.profile_id, where.start, where.size)
    log.info(
        "created MIG instance %s (%s at %d+%d on GPU %s) for pod %s/%s container %d",
        instance.uuid, profile.name, where.start, where.size, device.uuid, pod.namespace, pod.name, container_index,
    )  # fmt: skip
    records.append(Realized(container_index, position, instance))
    return instance, True


def _destroy(runtime: NodeRuntime, nvml: Nvml, instance: MigInstance) -> bool:
    """Destroy one instance; False when processes still hold it (it is kept for a later release)."""
    try:
        nvml.destroy_mig(instance.gpu_index, instance.gpu_instance_id)
    except NvmlError as exc:
        if exc.code == ERROR_IN_USE:
            log.warning("MIG instance %s is still in use, it will be destroyed later", instance.uuid)
            return False
        raise
    for key, records in runtime.created.items():
        runtime.created[key] = [r for r in records if r.instance != instance]
    log.info("destroyed MIG instance %s on GPU %s", instance.uuid, instance.gpu_uuid)
    return True


def release(settings: NvidiaSettings, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    """Destroy what `allocate` made for a finished pod and remove its accounting and grant directories."""
    runtime = runtime_for(settings)
    key = pod.uid or pod.name
    with runtime.lock:
        targets = [r.instance for r in runtime.created.get(key, ())]
        mig_uuids = {d.uuid for devices in placements for d in devices if d.uuid.startswith("MIG-")}
        try:
            reservations = _reservations(pod)
        except HamiError as exc:
            log.warning("releasing pod %s/%s without its reservations: %s", pod.namespace, pod.name, exc)
            reservations = []
        named = {(r.gpu_uuid, r.gpu_instance_id) for r in reservations if r.gpu_instance_id is not None}
        mig_uuids |= {r.mig_uuid for r in reservations if r.mig_uuid}
        nvml = runtime.session() if (targets or named or mig_uuids) else None
        if nvml is not None:
            try:
                if named or mig_uuids:
                    for info in [g for g in runtime.known_gpus().values() if g.mig_enabled]:
                        for instance in nvml.mig_instances(info.index):
                            wanted = (
                                instance.gpu_uuid,
                                instance.gpu_instance_id,
                            ) in named or instance.uuid in mig_uuids
                            if wanted and instance not in targets:
                                targets.append(instance)
                for instance in targets:
                    _destroy(runtime, nvml, instance)
            except NvmlError as exc:
                log.error("releasing the MIG instances of pod %s/%s failed: %s", pod.namespace, pod.name, exc)
        if not runtime.created.get(key):
            runtime.created.pop(key, None)
    host_dirs(settings).release(pod)


def reservations_after(settings: NvidiaSettings, pod: Pod) -> str | None:
    """The pod's ``hami.io/vgpu-mig-allocations`` with the runtime identity of the instances created for it, or
    None when there is nothing to write (no reservation, or none realized here)."""
    runtime = runtime_for(settings)
    created = [r.instance for r in runtime.created.get(pod.uid or pod.name, [])]
    try:
        reservations = _reservations(pod)
    except HamiError:
        return None
    if not reservations or not created:
        return None
    by_place = {(m.gpu_uuid, m.start, m.size): m for m in created}
    out = []
    for r in reservations:
        m = by_place.get((r.gpu_uuid, r.start, r.size))
        if m is not None and m.compute_instance_id is not None:
            r = MigReservation(
                r.container_index, r.device_index, r.gpu_uuid, r.profile, r.start, r.size,
                m.uuid, m.gpu_instance_id, m.compute_instance_id,
            )  # fmt: skip
        out.append(r)
    return encode_mig_allocations(out)
