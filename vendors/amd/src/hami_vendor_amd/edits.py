"""What the kubelet adds to an AMD GPU container, computed from a placement; and the node side of Allocate.

Owns the container side, as HAMi's AMD device plugin gives it:

* the device nodes ``/dev/kfd`` and, per granted GPU, ``/dev/dri/card<N>`` and ``/dev/dri/renderD<M>`` (``rw``);
* ``ROCR_VISIBLE_DEVICES``: ROCr's UUIDs of the granted GPUs in the placement's order (which is then the container's
  device numbering), and ``HIP_DEVICE_MEMORY_LIMIT=<MiB>m`` of the first GPU, HAMi's variable;
* in ``cu-mask`` mode (HAMi's) ``HSA_CU_MASK``, each GPU's own compute units (`hami_vendor_amd.cumask`, chosen at
  `allocate`, which also answers the pod's ``hami.io/amd-cu-allocated``);
* the isolation library ``libamvgpu.so`` and the ``/etc/ld.so.preload`` naming it (HAMi loads its own library through
  ``LD_AUDIT``; this one is preloaded, with the core's caller check), the container's accounting directory at
  ``/hami-amd-shmem`` (``<hookPath>/containers/<pod uid>_<container>``, prepared at `allocate`, removed at
  `release`) and the library's variables: ``HIP_DEVICE_MEMORY_LIMIT_<i>``, ``HIP_DEVICE_CORE_LIMIT_<i>``
  (``time-slice`` mode only; 0 under a CU mask, whose units are the container's compute share),
  ``HIP_DEVICE_MEMORY_SHARED_CACHE``, ``HIP_DEVICE_UUIDS``, ``LIBHIP_LOG_LEVEL``; and the container's grant
  (`hami.isolation.grant`, the same limits, in ``<hookPath>/grants/<pod uid>_<container>/amd.grant``, mounted
  read-only at ``/etc/hami/grant``), which the library reads first: the variables can then only lower a limit.

Deterministic: the same placement (and the units `allocate` chose for it) gives the same edits.
"""

from __future__ import annotations

import json
import math

from hami.errors import HamiError
from hami.isolation.containers import ContainerDirs, library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import Allocation, ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_amd.cumask import CU_ANNOTATION, CuMasks
from hami_vendor_amd.node import AmdGpu, runtime_for
from hami_vendor_amd.settings import CU_MASK, AmdSettings

__all__ = ["ACCOUNTING_FILE", "LIBRARY_FILE", "SHMEM_DIR", "allocate", "container_edits", "reconcile", "release"]

LIBRARY_FILE = "libamvgpu.so"
SHMEM_DIR = "/hami-amd-shmem"
ACCOUNTING_FILE = "amvgpu.cache"


def _dirs(settings: AmdSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "AMD GPU")


def allocate(settings: AmdSettings, pod: Pod, index: int, devices: ContainerPlacement) -> Allocation | None:
    """Check the GPUs are this node's, prepare the accounting directory and, under a CU mask, choose the units.

    :raises HamiError: a GPU is not on this node, or has fewer free units than granted."""
    if not devices:
        return None
    gpus = runtime_for(settings).by_uuid([d.uuid for d in devices])
    _dirs(settings).prepare(pod, index)
    if settings.core_split != CU_MASK:
        return None
    masks = CuMasks(settings.hook_path)
    masks.allocate(pod, index, devices, gpus)
    merged = masks.of_pod(pod, len(pod.all_containers))
    return Allocation(devices=devices, pod_annotations={CU_ANNOTATION: json.dumps(merged, separators=(",", ":"))})


def release(settings: AmdSettings, pod: Pod) -> None:
    _dirs(settings).release(pod)
    CuMasks(settings.hook_path).release(pod)


def reconcile(settings: AmdSettings, pods: list[Pod]) -> None:
    """After a restart: forget the directories and compute units of pods no longer on this node."""
    _dirs(settings).keep_only(pods)
    CuMasks(settings.hook_path).keep_only(pods)


def _percent(units: int, gpu: AmdGpu) -> int:
    """The least whole percentage of `gpu`'s compute units that the scheduler turns into `units` (floor); 0, no
    limit, for none or all of them."""
    if units <= 0 or units >= gpu.compute_units:
        return 0  # no limit
    return min(100, max(1, math.ceil(100 * units / gpu.compute_units)))


def container_edits(
    settings: AmdSettings, pod: Pod, index: int, devices: ContainerPlacement, library: IsolationLibrary | None = None
) -> ContainerEdits:
    """The device nodes, env and mounts of container `index` (init containers first) for its `devices`.

    :raises HamiError: a device is not on this node, or (CU mask) its units were not chosen at Allocate."""
    if not devices:
        return ContainerEdits()
    gpus = runtime_for(settings).by_uuid([d.uuid for d in devices])
    nodes = [DeviceNode(container_path="/dev/kfd", host_path="/dev/kfd", permissions="rw")]
    for g in gpus:
        for path in (f"/dev/dri/card{g.card}", f"/dev/dri/renderD{g.render}"):
            nodes.append(DeviceNode(container_path=path, host_path=path, permissions="rw"))
    env = {
        "ROCR_VISIBLE_DEVICES": ",".join(g.rocr_uuid for g in gpus),
        "HIP_DEVICE_MEMORY_LIMIT": f"{devices[0].usedmem}m",
    }
    masked = settings.core_split == CU_MASK
    if masked:
        record = CuMasks(settings.hook_path).of_container(pod, index)
        if set(record) != {d.uuid for d in devices}:
            raise HamiError(
                f"pod {pod.namespace}/{pod.name} container {index}: no compute units were chosen for "
                f"{', '.join(d.uuid for d in devices)} on this node (Allocate must run first)"
            )
        env["HSA_CU_MASK"] = ";".join(f"{i}:{record[d.uuid]}" for i, d in enumerate(devices))
    cores = [0 if masked else _percent(d.usedcores, g) for d, g in zip(devices, gpus, strict=True)]
    for i, (device, core) in enumerate(zip(devices, cores, strict=True)):
        env[f"HIP_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
        env[f"HIP_DEVICE_CORE_LIMIT_{i}"] = str(core if core < 100 else 0)
    env["HIP_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    env["HIP_DEVICE_UUIDS"] = ",".join(d.uuid for d in devices)
    if settings.libhip_log_level:
        env["LIBHIP_LOG_LEVEL"] = settings.libhip_log_level
    host = _dirs(settings)
    accounting = host.accounting_dir(pod, index)
    mounts = library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path)
    mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(accounting), read_only=False))
    grant = from_limits([(d.usedmem, c, d.uuid) for d, c in zip(devices, cores, strict=True)])
    grant_mount, files = grant_edits(host.grant_dir(pod, index), "amd", grant)
    mounts.append(grant_mount)
    return ContainerEdits(env=env, mounts=tuple(mounts), devices=tuple(nodes),
                          accounting_file=str(accounting / ACCOUNTING_FILE), files=files)  # fmt: skip
