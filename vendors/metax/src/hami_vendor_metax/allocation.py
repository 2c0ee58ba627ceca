"""Allocation on the node and the container's edits: what MetaX's device plugins do in the kubelet's Allocate.

Owns, for both kinds:

* `allocate`: the placement's cards resolved to this node's cards (a real UUID, or HAMi's capacity name
  ``<node>-metax-<i>`` when HAMi's scheduler placed a whole-card pod), rewritten with the real UUIDs, and the
  container's record written (`hami_vendor_metax.records`: cards, shares and QoS policy), which discovery
  publishes back in the node's annotations; retried for the same container, it rewrites the same record;
* ``hami-core`` mode (``sgpuMode``), a share of a card: the container's accounting directory
  ``<hookPath>/containers/<pod uid>_<container>`` prepared (`hami.isolation.containers`);
* `release`: the pod's records, accounting directories and grants removed (a pod never allocated or already
  released is nothing to do); `reconcile`, after a restart: those of every pod no longer on the node;
* `container_edits`: what MetaX's plugins give a container: the device nodes ``/dev/mxcd`` (``rwm``) and per card
  its DRM nodes ``/dev/dri/card<N>`` and ``/dev/dri/renderD<N>`` (``rw``, found by the card's PCI address in
  sysfs); ``METAX_VISIBLE_DEVICES``, the host indices of the cards (the selector MetaX's container runtime
  reads), and ``MACA_VISIBLE_DEVICES``, the cards as the container numbers them (``0,1,…``: it sees only its
  own DRM nodes); the driver (``driverPath``) at ``/opt/mxdriver`` and the MACA SDK (``macaPath``) at
  ``/opt/maca``, read-only. A share of a card (``Metax-SGPU``) is enforced by MetaX's sGPU components from the
  pod's ``metax-tech.com/gpu-devices-allocated``, which the scheduler wrote with the placement; in ``hami-core``
  mode by the isolation library ``libvmaca.so`` instead: the library and the ``/etc/ld.so.preload`` naming it, the
  accounting directory at ``/hami-vmaca-shmem``, ``MACA_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``,
  ``MACA_DEVICE_CORE_LIMIT_<i>`` (0 for a whole card), ``MACA_DEVICE_MEMORY_SHARED_CACHE``, ``MACA_DEVICE_UUIDS``,
  ``LIBVMACA_LOG_LEVEL``, and the container's grant (the same limits, written by the node daemon under
  ``<hookPath>/grants/`` and mounted read-only at ``/etc/hami/grant``), which the library reads first: the
  environment can then only lower a limit.

Deterministic: the same placement gives the same edits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hami import pcidevice
from hami.errors import HamiError
from hami.isolation.containers import ContainerDirs, library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import Allocation, ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_metax import records
from hami_vendor_metax.fit import APP_CLASS_ANNOTATION, BEST_EFFORT, ONLINE, QOS_ANNOTATION
from hami_vendor_metax.node import Card, runtime_for
from hami_vendor_metax.settings import SOFT, MetaxSettings

log = logging.getLogger("hami_vendor_metax")

__all__ = [
    "ACCOUNTING_FILE",
    "CONTROL_DEVICE",
    "LIBRARY_FILE",
    "SHMEM_DIR",
    "allocate",
    "container_edits",
    "reconcile",
    "release",
]

CONTROL_DEVICE = "/dev/mxcd"
LIBRARY_FILE = "libvmaca.so"
SHMEM_DIR = "/hami-vmaca-shmem"
ACCOUNTING_FILE = "vmaca.cache"
SGPU = "Metax-SGPU"
DRIVER_MOUNT, MACA_MOUNT = "/opt/mxdriver", "/opt/maca"


def allocate(settings: MetaxSettings, kind: str, pod: Pod, index: int, devices: ContainerPlacement) -> Allocation:
    """The placement with this node's card UUIDs, recorded.

    :raises HamiError: a placed card is not on this node, or the record cannot be written.
    """
    runtime = runtime_for(settings)
    resolved = tuple(d.model_copy(update={"uuid": runtime.card_of(d.uuid).uuid}) for d in devices)
    online = pod.annotations.get(APP_CLASS_ANNOTATION) == ONLINE
    qos = "" if online else pod.annotations.get(QOS_ANNOTATION) or BEST_EFFORT
    try:
        records.write(settings, pod, index, kind, resolved, qos)
    except OSError as exc:
        raise HamiError(f"cannot record the MetaX allocation under {settings.records_dir}: {exc}") from None
    if soft(settings, kind):
        dirs(settings).prepare(pod, index)
    return Allocation(devices=resolved)


def soft(settings: MetaxSettings, kind: str) -> bool:
    """Whether containers of `kind` get the isolation library on this node (shares, in ``hami-core`` mode)."""
    return kind == SGPU and settings.sgpu_mode == SOFT


def dirs(settings: MetaxSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "MetaX GPU")


def release(settings: MetaxSettings, pod: Pod) -> None:
    records.release(settings, pod)
    dirs(settings).release(pod)


def reconcile(settings: MetaxSettings, pods: Sequence[Pod]) -> None:
    """After a restart: forget what was served to pods no longer on this node (records, soft-mode directories)."""
    removed = records.keep_only(settings, pods) + dirs(settings).keep_only(pods)
    if removed:
        log.info("removed what MetaX pods gone while the node daemon was down held: %s", ", ".join(removed))


def _drm(settings: MetaxSettings, card: Card) -> tuple[str, str]:
    found = pcidevice.drm_nodes(Path(settings.sysfs_root), card.gpu.bdf)
    if found is None:
        raise HamiError(
            f"MetaX GPU {card.uuid} ({card.gpu.bdf}) has no DRM card and render node under "
            f"{Path(settings.sysfs_root) / 'bus' / 'pci' / 'devices' / card.gpu.bdf / 'drm'}"
        )
    return found


def container_edits(
    settings: MetaxSettings,
    kind: str,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The device nodes, env and mounts of a container granted these cards (see the module).

    :raises HamiError: a card is not on this node or has no DRM node.
    """
    if not devices:
        return ContainerEdits()
    cards = runtime_for(settings).cards_of([d.uuid for d in devices])
    nodes = [DeviceNode(container_path=CONTROL_DEVICE, host_path=CONTROL_DEVICE, permissions="rwm")]
    for card in cards:
        if not card.gpu.bdf:  # no driver on this node (simulated devices): no DRM node is known
            continue
        for name in _drm(settings, card):
            path = f"/dev/dri/{name}"
            nodes.append(DeviceNode(container_path=path, host_path=path, permissions="rw"))
    env = {
        "METAX_VISIBLE_DEVICES": ",".join(str(c.index) for c in cards),
        "MACA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(cards))),
    }
    mounts = [
        Mount(container_path=DRIVER_MOUNT, host_path=settings.driver_path),
        Mount(container_path=MACA_MOUNT, host_path=settings.maca_path),
    ]
    if not soft(settings, kind):
        return ContainerEdits(env=env, devices=tuple(nodes), mounts=tuple(mounts))
    for i, device in enumerate(devices):
        env[f"MACA_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
        env[f"MACA_DEVICE_CORE_LIMIT_{i}"] = str(device.usedcores if device.usedcores < 100 else 0)
    env["MACA_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    env["MACA_DEVICE_UUIDS"] = ",".join(c.uuid for c in cards)
    if settings.log_level:
        env["LIBVMACA_LOG_LEVEL"] = settings.log_level
    host = dirs(settings)
    accounting = host.accounting_dir(pod, index)
    mounts += library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path)
    mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(accounting), read_only=False))
    grant = from_limits([(d.usedmem, d.usedcores, c.uuid) for d, c in zip(devices, cards, strict=True)])
    grant_mount, files = grant_edits(host.grant_dir(pod, index), "metax", grant)
    mounts.append(grant_mount)
    return ContainerEdits(env=env, mounts=tuple(mounts), devices=tuple(nodes),
                          accounting_file=str(accounting / ACCOUNTING_FILE), files=files)  # fmt: skip
