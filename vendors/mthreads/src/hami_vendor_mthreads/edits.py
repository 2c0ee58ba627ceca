"""What the kubelet adds to a Moore Threads container: the device plugin's Allocate answer, from a placement.

Owns the container side, as Moore Threads' device plugin and container toolkit wire a GPU container:

* environment: ``MTHREADS_VISIBLE_DEVICES`` (the host indices of the granted GPUs, comma-separated: what the
  ``mthreads`` container runtime reads), ``MTHREADS_DRIVER_CAPABILITIES`` (``driverCapabilities``,
  ``compute,utility``) and ``MUSA_VISIBLE_DEVICES`` (the container's own ordinals ``0,…,n-1``, so a MUSA program
  enumerates exactly its GPUs in placement order);
* device nodes, ``rw``: per granted GPU ``/dev/mtgpu.<n>`` and its DRM nodes ``/dev/dri/card<n>`` and
  ``/dev/dri/renderD<n>``, as MTML names them (``mtmlDeviceGetGpuPath`` / ``GetPrimaryPath`` / ``GetRenderPath``),
  else found by the GPU's PCI address under ``<sysfsRoot>/bus/pci/devices/<BDF>/drm`` (``/dev/mtgpu.<index>``
  beside them). A GPU whose DRM nodes cannot be found is refused at Allocate, saying where it looked; on a node
  without any Moore Threads driver (simulated devices) only ``/dev/mtgpu.<index>`` is given.

In ``sgpu`` mode (HAMi's) Moore Threads' MT CloudNative Toolkit holds a container to its share of memory and cores;
the placement's share reaches it through the pod's ``mthreads.com/sgpu-*`` resources and annotations. In
``hami-core`` mode the container also gets the isolation library ``libvmusa.so`` and the ``/etc/ld.so.preload``
naming it (the library the node daemon installed, else ``libraryDir`` or ``<hookPath>``), its accounting directory
at ``/hami-vmusa-shmem`` and the library's environment: ``MUSA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``,
``MUSA_DEVICE_SM_LIMIT_<i>`` (the cores in percent, 4 of 16 is 25; 0 for a whole GPU), ``MUSA_DEVICE_UUIDS``,
``MUSA_DEVICE_MEMORY_SHARED_CACHE``, ``LIBVMUSA_LOG_LEVEL``; and its grant (`hami.isolation.grant`, the same
limits, written by the node daemon under ``<hookPath>/grants/<pod uid>_<container>/mthreads.grant`` and mounted
read-only at ``/etc/hami/grant``), which the library reads first: the environment can then only lower a limit.
Deterministic: the same placement gives the same edits.
"""

from __future__ import annotations

import re
from pathlib import Path

from hami.errors import HamiError
from hami.isolation.containers import library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_mthreads.allocation import accounting_dir, grant_dir
from hami_vendor_mthreads.discovery import runtime_for
from hami_vendor_mthreads.mtml import MtGpu
from hami_vendor_mthreads.settings import CORES_PER_GPU, SOFT, MthreadsSettings

__all__ = ["ACCOUNTING_FILE", "LIBRARY_FILE", "SHMEM_DIR", "container_edits", "device_nodes", "drm_nodes"]

LIBRARY_FILE = "libvmusa.so"
SHMEM_DIR = "/hami-vmusa-shmem"
ACCOUNTING_FILE = "vmusa.cache"

_CARD = re.compile(r"^card(\d+)$")
_RENDER = re.compile(r"^renderD(\d+)$")


def drm_nodes(settings: MthreadsSettings, gpu: MtGpu) -> tuple[str, str]:
    """The card and render node paths of `gpu` (``/dev/dri/card1``, ``/dev/dri/renderD129``).

    :raises HamiError: neither MTML nor sysfs names a DRM card and render node for the GPU.
    """
    if gpu.primary_path and gpu.render_path:
        return gpu.primary_path, gpu.render_path
    where = Path(settings.sysfs_root) / "bus" / "pci" / "devices" / gpu.bdf / "drm"
    try:
        names = [p.name for p in where.iterdir()] if gpu.bdf else []
    except OSError:
        names = []
    card = sorted((n for n in names if _CARD.match(n)), key=lambda n: int(n[4:]))
    render = sorted((n for n in names if _RENDER.match(n)), key=lambda n: int(n[7:]))
    if not card or not render:
        looked = f"MTML's paths and {where}" if gpu.bdf else "MTML's paths (no PCI address known)"
        raise HamiError(f"Moore Threads GPU {gpu.uuid} has no DRM card and render node in {looked}")
    return f"/dev/dri/{card[0]}", f"/dev/dri/{render[0]}"


def device_nodes(settings: MthreadsSettings, gpu: MtGpu, with_driver: bool) -> list[DeviceNode]:
    paths = [gpu.gpu_path or f"/dev/mtgpu.{gpu.index}"]
    if with_driver:
        paths.extend(drm_nodes(settings, gpu))
    return [DeviceNode(container_path=p, host_path=p, permissions="rw") for p in paths]


def percent(cores: int) -> int:
    """Sixteenths of a GPU as the library's percent of device time; 0 (no limit) for the whole GPU."""
    return 0 if cores >= CORES_PER_GPU else cores * 100 // CORES_PER_GPU


def _soft(
    settings: MthreadsSettings, pod: Pod, index: int, devices: ContainerPlacement, library: IsolationLibrary | None
) -> ContainerEdits:
    env = {}
    for i, device in enumerate(devices):
        env[f"MUSA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
        env[f"MUSA_DEVICE_SM_LIMIT_{i}"] = str(percent(device.usedcores))
    env["MUSA_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    env["MUSA_DEVICE_UUIDS"] = ",".join(d.uuid for d in devices)
    if settings.libvmusa_log_level:
        env["LIBVMUSA_LOG_LEVEL"] = settings.libvmusa_log_level
    host_dir = accounting_dir(settings, pod, index)
    mounts = library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path)
    mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(host_dir), read_only=False))
    grant = from_limits([(d.usedmem, percent(d.usedcores), d.uuid) for d in devices])
    grant_mount, files = grant_edits(grant_dir(settings, pod, index), "mthreads", grant)
    mounts.append(grant_mount)
    return ContainerEdits(env=env, mounts=tuple(mounts), accounting_file=str(host_dir / ACCOUNTING_FILE), files=files)


def container_edits(
    settings: MthreadsSettings,
    devices: ContainerPlacement,
    pod: Pod | None = None,
    index: int = 0,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The env, device nodes and (``hami-core`` mode) mounts of container `index` of `pod`, granted `devices`.

    :raises HamiError: a GPU is not on this node, or has no DRM node.
    """
    if not devices:
        return ContainerEdits()
    runtime = runtime_for(settings)
    gpus = runtime.gpus_of([d.uuid for d in devices])
    nodes = [n for g in gpus for n in device_nodes(settings, g, bool(runtime.source))]
    env = {
        "MTHREADS_VISIBLE_DEVICES": ",".join(str(g.index) for g in gpus),
        "MTHREADS_DRIVER_CAPABILITIES": settings.driver_capabilities,
        "MUSA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(gpus))),
    }
    if settings.sharing_mode == SOFT:
        soft = _soft(settings, pod or Pod(name="pod"), index, devices, library)
        return soft.model_copy(update={"env": {**env, **soft.env}, "devices": tuple(nodes)})
    return ContainerEdits(env=env, devices=tuple(nodes))
