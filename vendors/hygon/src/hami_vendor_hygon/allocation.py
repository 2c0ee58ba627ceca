"""Allocation on the node: what a DCU container needs on the host before it starts, and its removal.

Owns, per node mode:

* ``vdcu`` (HAMi's): a container granted one DCU and less than its whole memory gets its vDCU
  (`hami_vendor_hygon.vdcu`: CUs from the device's free ones, memory in MiB, created through DMI where present,
  described by its ``vdev*.conf``). Allocate retried for the same container finds the vDCU it made. Whole DCUs
  need nothing;
* ``hami-core`` (the isolation library): the container's accounting directory
  ``<hookPath>/containers/<pod uid>_<container>``, emptied and made world-writable so that whatever user the
  container runs as can create its accounting file there.

`release` undoes both for a finished pod (tolerating a pod never allocated or already released). After a crash,
the first use of the node runtime reconciles the driver's virtual devices with the directories on disk
(`VdcuState.reconcile`), and `reconcile` (the daemon's `hami_reconcile` at its start, with the pods still bound to
the node) also removes the vDCUs of pods deleted while the daemon was down: their directories, exporter copies
and the driver's devices, so their compute units are free again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from hami.errors import HamiError
from hami.hostpaths import HostPathError, path_component
from hami.isolation.containers import ContainerDirs, container_name
from hami.model import ContainerPlacement, Pod
from hami_vendor_hygon.node import runtime_for
from hami_vendor_hygon.settings import SOFT, HygonSettings
from hami_vendor_hygon.vdcu import VdcuState, VdevEntry

__all__ = ["accounting_dir", "allocate", "container_name", "gets_vdcu", "reconcile", "release", "state_of"]

log = logging.getLogger("hami_vendor_hygon")


def _dirs(settings: HygonSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "DCU")


def accounting_dir(settings: HygonSettings, pod: Pod, index: int) -> Path:
    """The host directory of container `index`'s accounting file (mounted writable into it).

    :raises HostPathError: the pod UID or container name would leave `containers_dir`."""
    return _dirs(settings).accounting_dir(pod, index)


def grant_host_dir(settings: HygonSettings, pod: Pod, index: int) -> Path:
    """The host directory of container `index`'s grant (`hami.isolation.grant`), mounted read-only, outside its
    accounting directory. :raises HostPathError: as `accounting_dir`."""
    return Path(_dirs(settings).grant_dir(pod, index))


def state_of(settings: HygonSettings) -> VdcuState:
    return VdcuState(settings.vdev_dir, settings.exporter_dir)


def gets_vdcu(settings: HygonSettings, devices: ContainerPlacement) -> bool:
    """HAMi's rule: one DCU, less than its whole memory (and the node in vDCU mode)."""
    if settings.dcu_mode == SOFT or len(devices) != 1:
        return False
    (device,) = runtime_for(settings).by_uuid([devices[0].uuid])
    return devices[0].usedmem < device.memory_total // (1024 * 1024)


def allocate(settings: HygonSettings, pod: Pod, container_index: int, devices: ContainerPlacement) -> None:
    if not devices:
        return
    runtime = runtime_for(settings)
    if settings.dcu_mode == SOFT:
        runtime.by_uuid([d.uuid for d in devices])
        _dirs(settings).prepare(pod, container_index)
        return
    if not gets_vdcu(settings, devices):
        return
    uid = pod.uid or pod.name
    if not uid or "_" in uid:
        raise HamiError(f"pod {pod.namespace}/{pod.name} has no usable UID for its vDCU directory")
    (device,) = runtime.by_uuid([devices[0].uuid])
    with runtime.lock:
        runtime.reconcile_once()
        state_of(settings).create(uid, container_name(pod, container_index), device, devices[0].usedcores,
                                  devices[0].usedmem, runtime.dmi())  # fmt: skip


def vdev_of(settings: HygonSettings, pod: Pod, container_index: int) -> VdevEntry | None:
    return state_of(settings).find(pod.uid or pod.name, container_name(pod, container_index))


def release(settings: HygonSettings, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    key = pod.uid or pod.name
    if not key or "_" in key:
        return
    try:
        path_component(key, "pod UID")  # a hostile UID (`../x`) must not reach the vDCU state's glob
    except HostPathError as exc:
        log.warning("not releasing pod %s/%s: %s", pod.namespace, pod.name, exc)
        return
    runtime = runtime_for(settings)
    with runtime.lock:
        state_of(settings).release(key, runtime.dmi())
    _dirs(settings).release(pod)


def reconcile(settings: HygonSettings, pods: Sequence[Pod]) -> None:
    """After a restart: remove the vDCUs of pods not in `pods` (those still bound to this node), then destroy the
    driver's virtual devices that no directory names."""
    runtime = runtime_for(settings)
    with runtime.lock:
        runtime.reconciled_with([p.uid or p.name for p in pods])
