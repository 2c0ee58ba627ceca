"""What the kubelet adds to an NVIDIA container: HAMi's Allocate answer, computed from a placement.

Owns the container side of the contract with the isolation library (``libvgpu.so``, built separately under
``vendors/nvidia/isolation``), exactly as HAMi v2.10's device plugin writes it for a shared (hami-core) GPU:

* env ``NVIDIA_VISIBLE_DEVICES`` (the GPU UUIDs), ``CUDA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m`` per device,
  ``CUDA_DEVICE_SM_LIMIT`` (the container's core share), ``CUDA_DEVICE_MEMORY_SHARED_CACHE`` (the accounting
  file, ``<hookPath>/vgpu/<id>.cache``), ``CUDA_OVERSUBSCRIBE=true`` when ``deviceMemoryScaling`` is over 1,
  ``LIBCUDA_LOG_LEVEL`` when configured, ``GPU_CORE_UTILIZATION_POLICY=disable`` when ``disableCoreLimit``;
* mounts, in HAMi's order: the library, the container's own accounting directory
  (``<hookPath>/vgpu/containers/<pod uid>_<container>`` at ``<hookPath>/vgpu``) and ``/etc/ld.so.preload`` naming
  the library (not HAMi's ``/tmp/vgpulock``: a host directory every container could write, which nothing here
  uses). A container that sets ``CUDA_DISABLE_CONTROL=true`` gets neither
  the library nor the preload file, when it was placed on whole GPUs (100 % cores on each: admission refuses
  the opt-out for anything less, and a container placed with less gets the library all the same);
* CDI device names ``nvidia.com/gpu=<uuid>`` for runtimes that use CDI (``deviceListStrategy``);
* the container's grant (`hami.isolation.grant`): the same limits, the core policy (``disable`` when
  ``disableCoreLimit``, else ``gpuCorePolicy``), the priority its spec asked (``CUDA_TASK_PRIORITY``, default 1),
  oversubscription and the driver's per-process context memory (``contextMemoryMiB``, counted against the
  limit), in ``<hookPath>/vgpu/grants/<pod uid>_<container>/nvidia.grant`` (``files``), that directory mounted
  read-only at ``/etc/hami/grant``. The library reads it first; the environment above only lowers it, so
  a process of the container cannot lift its limits by changing its children's variables.

Which library: the one the node daemon installed from this package (``library``:
``<hook-dir>/nvidia/libvgpu.so``, mounted at that same path, and the preload file beside it, which names that
path), unless ``libraryDir`` is configured (an operator-managed copy, mounted as HAMi mounts it: at
``<hookPath>/vgpu/libvgpu.so``, with ``<libraryDir>/ld.so.preload``). Without either, HAMi's own layout is
assumed (``libraryDir`` = ``<hookPath>/vgpu``), which is what a node whose library HAMi installed provides.

A MIG placement (devices named by MIG UUIDs after `hami_allocate`) gets ``NVIDIA_VISIBLE_DEVICES=<MIG UUIDs>``
and its CDI names only: the hardware partition is the isolation. Where HAMi names the accounting file with a
random UUID, the name here is derived from the pod UID and container name, so the edits are deterministic
(the conformance kit checks it) and a repeated Allocate gives the same file.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import PurePosixPath

from hami.isolation.containers import ContainerDirs, container_name
from hami.isolation.grant import Grant, from_limits, grant_edits
from hami.model import Container, ContainerEdits, ContainerPlacement, IsolationLibrary, Mount, Pod
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = [
    "CDI_KIND",
    "DISABLE_CONTROL_ENV",
    "LIBRARY_FILE",
    "PRELOAD_FILE",
    "cache_host_dir",
    "container_edits",
    "control_disabled",
    "grant_host_dir",
    "library_mounts",
]

LIBRARY_FILE = "libvgpu.so"
PRELOAD_FILE = "ld.so.preload"
CDI_KIND = "nvidia.com/gpu"
DISABLE_CONTROL_ENV = "CUDA_DISABLE_CONTROL"
_CACHE_NAMESPACE = uuid.UUID("6f0c3f4e-8f1e-4d6c-9a51-4a6d1e0b7c21")
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}


def control_disabled(container: Container | None) -> bool:
    """The container sets ``CUDA_DISABLE_CONTROL`` to true (Go's ParseBool spellings, as HAMi reads it)."""
    return container is not None and container.env.get(DISABLE_CONTROL_ENV, "").strip() in _TRUE


def _container(pod: Pod, index: int) -> Container | None:
    containers = pod.all_containers
    return containers[index] if 0 <= index < len(containers) else None


def host_dirs(settings: NvidiaSettings) -> ContainerDirs:
    """``<hookPath>/vgpu/containers`` (accounting) and ``<hookPath>/vgpu/grants`` (grants), one directory each per
    container (core's `hami.isolation.containers`)."""
    return ContainerDirs(settings.vgpu_dir, "GPU")


def cache_host_dir(settings: NvidiaSettings, pod: Pod, index: int) -> PurePosixPath:
    """The host directory holding the container's accounting file."""
    return PurePosixPath(host_dirs(settings).accounting_dir(pod, index))


def grant_host_dir(settings: NvidiaSettings, pod: Pod, index: int) -> PurePosixPath:
    """The host directory holding the container's grant (mounted read-only, outside its accounting directory)."""
    return host_dirs(settings).grant_dir(pod, index)


def _grant(settings: NvidiaSettings, container: Container | None, devices: ContainerPlacement) -> Grant:
    asked = container.env.get("CUDA_TASK_PRIORITY", "").strip() if container is not None else ""
    priority = int(asked) if asked.isdigit() and int(asked) <= 1000 else 1
    policy = "disable" if settings.disable_core_limit else settings.gpu_core_policy
    limits = [(d.usedmem, d.usedcores, d.uuid) for d in devices]
    grant = from_limits(limits, policy, priority, settings.device_memory_scaling > 1)
    return replace(grant, context_bytes=settings.context_memory_mib << 20)


def library_mounts(settings: NvidiaSettings, library: IsolationLibrary | None) -> tuple[Mount, Mount]:
    """The mounts of the isolation library and of the ``/etc/ld.so.preload`` naming it (see the module's doc)."""
    if library is not None and settings.library_dir is None:
        return (
            Mount(container_path=library.path, host_path=library.path),
            Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path),
        )
    libdir = PurePosixPath(settings.host_library_dir)
    inside = PurePosixPath(settings.vgpu_dir) / LIBRARY_FILE
    return (
        Mount(container_path=str(inside), host_path=str(libdir / LIBRARY_FILE)),
        Mount(container_path="/etc/ld.so.preload", host_path=str(libdir / PRELOAD_FILE)),
    )


def container_edits(
    settings: NvidiaSettings,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The env, mounts and CDI names of container `index` (init containers first) for its `devices`;
    `library` is the isolation library the node daemon installed, if any."""
    if not devices:
        return ContainerEdits()
    uuids = [d.uuid for d in devices]
    env: dict[str, str] = {}
    if "envvar" in settings.device_list_strategy:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(uuids)
    cdi = tuple(f"{CDI_KIND}={u}" for u in uuids) if "cdi-cri" in settings.device_list_strategy else ()
    if all(u.startswith("MIG-") for u in uuids):
        return ContainerEdits(env=env, cdi_devices=cdi)
    vgpu = PurePosixPath(settings.vgpu_dir)
    for i, device in enumerate(devices):
        env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
    env["CUDA_DEVICE_SM_LIMIT"] = str(devices[0].usedcores)
    name = container_name(pod, index)
    cache_id = uuid.uuid5(_CACHE_NAMESPACE, f"{pod.namespace}/{pod.name}/{pod.uid}/{name}")
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(vgpu / f"{cache_id}.cache")
    if settings.device_memory_scaling > 1:
        env["CUDA_OVERSUBSCRIBE"] = "true"
    if settings.lib_cuda_log_level:
        env["LIBCUDA_LOG_LEVEL"] = settings.lib_cuda_log_level
    if settings.disable_core_limit:
        env["GPU_CORE_UTILIZATION_POLICY"] = "disable"
    whole = all(d.usedcores >= 100 for d in devices)
    controlled = not (whole and control_disabled(_container(pod, index)))
    lib, preload = library_mounts(settings, library)
    mounts = []
    if controlled:
        mounts.append(lib)
    mounts.append(Mount(container_path=str(vgpu), host_path=str(cache_host_dir(settings, pod, index)), read_only=False))
    files: dict[str, str] = {}
    if controlled:
        mounts.append(preload)
        grant_mount, files = grant_edits(grant_host_dir(settings, pod, index), "nvidia",
                                         _grant(settings, _container(pod, index), devices))  # fmt: skip
        mounts.append(grant_mount)
    accounting = str(cache_host_dir(settings, pod, index) / f"{cache_id}.cache") if controlled else None
    return ContainerEdits(env=env, mounts=tuple(mounts), cdi_devices=cdi, accounting_file=accounting, files=files)
