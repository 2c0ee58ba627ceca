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

HAMi itself relies on Moore Threads' MT CloudNative Toolkit (sGPU) to hold a container to its share of memory and
cores; the placement's share reaches it through the pod's ``mthreads.com/sgpu-*`` resources and annotations.
Deterministic: the same placement gives the same edits.
"""

from __future__ import annotations

import re
from pathlib import Path

from hami.errors import HamiError
from hami.model import ContainerEdits, ContainerPlacement, DeviceNode
from hami_vendor_mthreads.discovery import runtime_for
from hami_vendor_mthreads.mtml import MtGpu
from hami_vendor_mthreads.settings import MthreadsSettings

__all__ = ["container_edits", "device_nodes", "drm_nodes"]

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


def container_edits(settings: MthreadsSettings, devices: ContainerPlacement) -> ContainerEdits:
    """The env and device nodes of a container granted `devices`.

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
    return ContainerEdits(env=env, devices=tuple(nodes))
