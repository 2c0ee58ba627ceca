"""What the kubelet adds to an Ascend container: HAMi's Allocate answer, computed from a placement.

Owns the container side of the contract with Ascend's container runtime and with the isolation library
(``libvnpu.so``, built from ``vendors/ascend/isolation``):

* always ``ASCEND_VISIBLE_DEVICES``: the physical ids of the placement's chips, in placement order (the node's
  driver maps UUIDs to physical ids: `hami_vendor_ascend.node`);
* template mode: ``ASCEND_VNPU_SPECS``, the vNPU template to cut (the template whose memory the placement records,
  else the one the scheduler wrote in the pod's ``huawei.com/<CW>`` annotation), which makes Ascend's container
  runtime create the vNPU when the container starts; nothing for whole cards: the hardware does the isolation;
* soft-split mode (``huawei.com/vnpu-mode: hami-core``): the isolation library and its environment:
  ``ASCEND_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` and ``ASCEND_DEVICE_CORE_LIMIT_<i>`` per device, the container's
  accounting file ``ASCEND_DEVICE_MEMORY_SHARED_CACHE`` (``/hami-vnpu-shmem/vnpu.cache``, backed by the host
  directory ``<hookPath>/containers/<pod uid>_<container>``), ``ASCEND_DEVICE_UUIDS`` (recorded in the accounting
  file for the node daemon's monitor), ``LIBVNPU_LOG_LEVEL`` and ``ASCEND_CORE_UTILIZATION_POLICY=disable`` when
  configured; mounts, in HAMi's order: the driver files HAMi mounts read-only (``driverMounts``), the library,
  ``/etc/ld.so.preload`` naming it, and the accounting directory; and the container's grant
  (`hami.isolation.grant`: the same limits, the policy ``disable`` when configured, else ``default``) in
  ``<hookPath>/grants/<pod uid>_<container>/ascend.grant`` (``files``), that directory mounted read-only at
  ``/etc/hami/grant``, which the library reads first and the environment may only lower.

Which library: the one the node daemon installed from this package (``library``: mounted at its own host path,
and the preload file beside it at ``/etc/ld.so.preload``), unless ``libraryDir`` names an operator-managed copy;
without either, ``<hookPath>/libvnpu.so`` and ``<hookPath>/ld.so.preload``, where an operator would put them.

Deterministic: the same placement gives the same edits (the accounting directory is named by pod UID and container
name, which is also how the node daemon attributes usage).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from hami.errors import HamiError, RequestError
from hami.isolation.containers import ContainerDirs
from hami.isolation.containers import library_mounts as shared_library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import ContainerEdits, ContainerPlacement, DeviceKind, IsolationLibrary, Mount, Pod
from hami_vendor_ascend.admission import vnpu_mode
from hami_vendor_ascend.fit import runtime_templates
from hami_vendor_ascend.node import runtime_for
from hami_vendor_ascend.settings import SOFT_SPLIT, AscendSettings

__all__ = [
    "ACCOUNTING_FILE",
    "LIBRARY_FILE",
    "SHMEM_DIR",
    "accounting_dir",
    "container_edits",
    "grant_host_dir",
    "library_mounts",
]

LIBRARY_FILE = "libvnpu.so"
PRELOAD_FILE = "ld.so.preload"
SHMEM_DIR = "/hami-vnpu-shmem"
"""Where a soft-split container sees its accounting directory (HAMi's path)."""
ACCOUNTING_FILE = "vnpu.cache"


def _dirs(settings: AscendSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "NPU")


def accounting_dir(settings: AscendSettings, pod: Pod, index: int) -> PurePosixPath:
    """The host directory holding container `index`'s accounting file."""
    return PurePosixPath(_dirs(settings).accounting_dir(pod, index))


def grant_host_dir(settings: AscendSettings, pod: Pod, index: int) -> PurePosixPath:
    """The host directory holding container `index`'s grant (mounted read-only, outside its accounting directory)."""
    return _dirs(settings).grant_dir(pod, index)


def library_mounts(settings: AscendSettings, library: IsolationLibrary | None) -> tuple[Mount, Mount]:
    """The mounts of the isolation library and of the ``/etc/ld.so.preload`` naming it (see the module's doc)."""
    library_mount, preload = shared_library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path)
    return library_mount, preload


def container_edits(
    settings: AscendSettings,
    kind: DeviceKind,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The env and mounts of container `index` (init containers first) for its `devices`.

    :raises HamiError: a device is not on this node, or the pod's vNPU mode cannot be read.
    """
    if not devices:
        return ContainerEdits()
    uuids = [d.uuid for d in devices]
    physical = runtime_for(settings).physical_ids(uuids)
    env: dict[str, str] = {"ASCEND_VISIBLE_DEVICES": ",".join(str(p) for p in physical)}
    try:
        mode = vnpu_mode(pod, settings)
    except RequestError as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: {exc}") from None
    if mode != SOFT_SPLIT:
        template = _template(settings, kind, pod, devices)
        if template:
            env["ASCEND_VNPU_SPECS"] = template
        return ContainerEdits(env=env)
    for i, device in enumerate(devices):
        env[f"ASCEND_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
        env[f"ASCEND_DEVICE_CORE_LIMIT_{i}"] = str(device.usedcores)
    env["ASCEND_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    env["ASCEND_DEVICE_UUIDS"] = ",".join(uuids)
    if settings.libvnpu_log_level:
        env["LIBVNPU_LOG_LEVEL"] = settings.libvnpu_log_level
    if settings.disable_core_limit:
        env["ASCEND_CORE_UTILIZATION_POLICY"] = "disable"
    host_dir = accounting_dir(settings, pod, index)
    mounts = [Mount(container_path=path, host_path=path) for path in settings.driver_mounts]
    mounts.extend(library_mounts(settings, library))
    mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(host_dir), read_only=False))
    policy = "disable" if settings.disable_core_limit else "default"
    grant = from_limits([(d.usedmem, d.usedcores, d.uuid) for d in devices], policy)
    grant_mount, files = grant_edits(grant_host_dir(settings, pod, index), "ascend", grant)
    mounts.append(grant_mount)
    return ContainerEdits(env=env, mounts=tuple(mounts), accounting_file=str(host_dir / ACCOUNTING_FILE), files=files)


def _template(settings: AscendSettings, kind: DeviceKind, pod: Pod, devices: ContainerPlacement) -> str:
    """The vNPU template of a template-mode placement, "" for whole cards: the configured template whose memory
    the container's grant records, else what the scheduler wrote in ``huawei.com/<CW>`` (a template configured
    away since; HAMi reads only that annotation, whose entries are per device, not per container)."""
    chip = settings.chips[kind.common_word]
    for device in devices:
        template = chip.template_for(device.usedmem) if device.usedmem < chip.memory_allocatable else None
        if template is not None and template.memory == device.usedmem:
            return template.name
    recorded = runtime_templates(pod.annotations, kind)
    for device in devices:
        if device.usedmem < chip.memory_allocatable and recorded.get(device.uuid):
            return recorded[device.uuid]
    return ""
