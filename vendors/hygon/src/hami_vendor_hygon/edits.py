"""What the kubelet adds to a DCU container: HAMi's DCU plugin's Allocate answer, computed from a placement.

Owns the container side:

* always, as HAMi's plugin: the device nodes ``/dev/kfd`` and ``/dev/mkfd`` (``rwm``), and per granted DCU its
  DRM nodes ``/dev/dri/card<N>`` and ``/dev/dri/renderD<N>`` (``rw``), found by the DCU's PCI address under
  ``<sysfsRoot>/bus/pci/devices/<BDF>/drm`` (the driver's own link, so the right node whatever order the cards
  were probed in; a simulated DCU's come from its inventory's ``driver.drmCard``/``drmRender``). HAMi sets no
  environment for DCUs: the container sees only its DRM nodes;
* ``vdcu`` mode, a container with a vDCU (`hami_vendor_hygon.allocation.gets_vdcu`): its vdev directory mounted
  at ``/etc/vdev/docker/``, ``hygonDriverPath`` (``$HYGONPATH``) at ``/opt/hygondriver`` and ``hyhalPath`` at
  ``/opt/hyhal``: read-only (HAMi mounts them read-write, which lets a tenant rewrite its vDCU's file, pointing it
  at another container's vDCU, or the host's driver files; ``writableMounts: true`` restores HAMi's mounts);
* ``hami-core`` mode: the isolation library ``libvdcu.so`` and the ``/etc/ld.so.preload`` naming it (the library
  the node daemon installed, else ``libraryDir`` or ``<hookPath>``), ``hyhalPath`` read-only, the accounting
  directory at ``/hami-vdcu-shmem`` and the library's environment: ``HIP_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``,
  ``HIP_DEVICE_CORE_LIMIT_<i>``, ``HIP_DEVICE_MEMORY_SHARED_CACHE``, ``HIP_DEVICE_UUIDS``, ``LIBVDCU_LOG_LEVEL``;
  and the container's grant (`hami.isolation.grant`: the same limits, written by the node daemon in
  ``<hookPath>/grants/<pod uid>_<container>/hygon.grant`` and mounted read-only at ``/etc/hami/grant``), which the
  library reads first: the environment above can then only lower a limit.

Deterministic: the same placement (and the vDCU allocation made for it) gives the same edits.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from hami import pcidevice
from hami.errors import HamiError
from hami.isolation.containers import library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_hygon.allocation import accounting_dir, gets_vdcu, grant_host_dir, state_of, vdev_of
from hami_vendor_hygon.dtk import Dcu
from hami_vendor_hygon.node import runtime_for
from hami_vendor_hygon.settings import SOFT, HygonSettings
from hami_vendor_hygon.vdcu import CONTAINER_DIR

__all__ = ["ACCOUNTING_FILE", "LIBRARY_FILE", "SHMEM_DIR", "container_edits", "drm_nodes"]

LIBRARY_FILE = "libvdcu.so"
SHMEM_DIR = "/hami-vdcu-shmem"
ACCOUNTING_FILE = "vdcu.cache"


def drm_nodes(settings: HygonSettings, device: Dcu) -> tuple[str, str]:
    """The card and render node names of `device` (``card1``, ``renderD129``).

    :raises HamiError: the driver shows no DRM node for the DCU's PCI address.
    """
    if device.drm is not None:  # a simulated DCU: the inventory names them
        return device.drm
    found = pcidevice.drm_nodes(Path(settings.sysfs_root), device.bdf)
    if found is None:
        where = Path(settings.sysfs_root) / "bus" / "pci" / "devices" / device.bdf / "drm"
        raise HamiError(f"DCU {device.uuid} ({device.bdf}) has no DRM card and render node under {where}")
    return found


def container_edits(
    settings: HygonSettings,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The device nodes, mounts and env of container `index` (init containers first) for its `devices`.

    :raises HamiError: a device is not on this node, has no DRM node, or its vDCU was not allocated.
    """
    if not devices:
        return ContainerEdits()
    dcus = runtime_for(settings).by_uuid([d.uuid for d in devices])
    nodes = [
        DeviceNode(container_path="/dev/kfd", host_path="/dev/kfd", permissions="rwm"),
        DeviceNode(container_path="/dev/mkfd", host_path="/dev/mkfd", permissions="rwm"),
    ]
    for dcu in dcus:
        for name in drm_nodes(settings, dcu):
            path = f"/dev/dri/{name}"
            nodes.append(DeviceNode(container_path=path, host_path=path, permissions="rw"))
    if settings.dcu_mode == SOFT:
        env = {}
        for i, device in enumerate(devices):
            env[f"HIP_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
            env[f"HIP_DEVICE_CORE_LIMIT_{i}"] = str(device.usedcores if device.usedcores < 100 else 0)
        env["HIP_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
        env["HIP_DEVICE_UUIDS"] = ",".join(d.uuid for d in devices)
        if settings.libvdcu_log_level:
            env["LIBVDCU_LOG_LEVEL"] = settings.libvdcu_log_level
        host_dir = accounting_dir(settings, pod, index)
        mounts = [Mount(container_path=settings.hyhal_path, host_path=settings.hyhal_path)]
        mounts.extend(library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path))
        mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(host_dir), read_only=False))
        grant = from_limits([(d.usedmem, d.usedcores, d.uuid) for d in devices])
        grant_mount, files = grant_edits(PurePosixPath(grant_host_dir(settings, pod, index)), "hygon", grant)
        mounts.append(grant_mount)
        return ContainerEdits(env=env, mounts=tuple(mounts), devices=tuple(nodes),
                              accounting_file=str(host_dir / ACCOUNTING_FILE), files=files)  # fmt: skip
    if not gets_vdcu(settings, devices):
        return ContainerEdits(devices=tuple(nodes))
    entry = vdev_of(settings, pod, index)
    if entry is None:
        raise HamiError(
            f"pod {pod.namespace}/{pod.name} container {index}: no vDCU was allocated for its share of "
            f"{devices[0].uuid} (Allocate must run first)"
        )
    read_only = not settings.writable_mounts
    vdev_mounts = (
        Mount(container_path=CONTAINER_DIR, host_path=str(state_of(settings).directory(entry)), read_only=read_only),
        Mount(container_path="/opt/hygondriver", host_path=settings.hygon_driver_path, read_only=read_only),
        Mount(container_path="/opt/hyhal", host_path=settings.hyhal_path, read_only=read_only),
    )
    return ContainerEdits(mounts=vdev_mounts, devices=tuple(nodes))
