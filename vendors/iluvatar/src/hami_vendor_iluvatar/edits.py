"""What the kubelet adds to an Iluvatar container, computed from a placement; and the soft mode's host side.

Owns the container side, as Iluvatar's device plugin and container toolkit give it:

* always: ``IX_VISIBLE_DEVICES`` (the granted chips' UUIDs, comma-separated, what Iluvatar's device plugin sets and
  its container toolkit reads) and ``ILUVATAR_COREX_VISIBLE_DEVICES`` (the same, the name before the plugin's
  2025-11 rename, for older toolkits); the device nodes ``/dev/iluvatar<minor>`` of the granted chips (by ixML's
  minor number) and the control node ``/dev/itrctl``; and, unless ``mountCorex: false``, CoreX's ``bin`` and
  ``lib64`` (``corexPath``, default ``/usr/local/corex``) read-only, as the toolkit mounts them;
* ``hami-core`` mode: the isolation library ``libvcorex.so`` and the ``/etc/ld.so.preload`` naming it, the
  container's accounting directory at ``/hami-vcorex-shmem`` (``<hookPath>/containers/<pod uid>_<container>``,
  prepared at Allocate, removed at release: `allocate`, `release`) and the library's variables:
  ``IX_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``, ``IX_DEVICE_SM_LIMIT_<i>``, ``IX_DEVICE_MEMORY_SHARED_CACHE``,
  ``IX_LOG_LEVEL``; and the container's grant (`hami.isolation.grant`, the same limits, in
  ``<hookPath>/grants/<pod uid>_<container>/iluvatar.grant``, mounted read-only at ``/etc/hami/grant``), which the
  library reads first: the variables can then only lower a limit.

In ``gpu-manager`` mode (HAMi's) the shares are Iluvatar's gpu-manager's to enforce; HAMi's admission adds
``SOL_CONTINER_NAME`` (sic) for it (`hami_vendor_iluvatar.plugin`). Deterministic: the same placement gives the
same edits.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from hami.isolation.containers import ContainerDirs, library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_iluvatar.node import runtime_for
from hami_vendor_iluvatar.settings import SOFT, IluvatarSettings

__all__ = ["ACCOUNTING_FILE", "LIBRARY_FILE", "SHMEM_DIR", "allocate", "container_edits", "dirs", "release"]

LIBRARY_FILE = "libvcorex.so"
SHMEM_DIR = "/hami-vcorex-shmem"
ACCOUNTING_FILE = "vcorex.cache"
CONTROL_NODE = "/dev/itrctl"


def dirs(settings: IluvatarSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "Iluvatar GPU")


def allocate(settings: IluvatarSettings, pod: Pod, index: int, devices: ContainerPlacement) -> None:
    """``hami-core`` mode: check the GPUs are this node's and prepare the container's accounting directory."""
    if not devices or settings.iluvatar_mode != SOFT:
        return
    runtime_for(settings).by_uuid([d.uuid for d in devices])
    dirs(settings).prepare(pod, index)


def release(settings: IluvatarSettings, pod: Pod) -> None:
    dirs(settings).release(pod)


def container_edits(
    settings: IluvatarSettings,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The env, device nodes and mounts of container `index` (init containers first) for its `devices`.

    :raises HamiError: a device is not on this node."""
    if not devices:
        return ContainerEdits()
    gpus = runtime_for(settings).by_uuid([d.uuid for d in devices])
    uuids = ",".join(d.uuid for d in devices)
    env = {"IX_VISIBLE_DEVICES": uuids, "ILUVATAR_COREX_VISIBLE_DEVICES": uuids}
    nodes = [DeviceNode(container_path=f"/dev/iluvatar{g.minor}", host_path=f"/dev/iluvatar{g.minor}") for g in gpus]
    nodes.append(DeviceNode(container_path=CONTROL_NODE, host_path=CONTROL_NODE))
    mounts: list[Mount] = []
    if settings.mount_corex:
        corex = PurePosixPath(settings.corex_path)
        mounts += [Mount(container_path=str(corex / d), host_path=str(corex / d)) for d in ("bin", "lib64")]
    if settings.iluvatar_mode != SOFT:
        return ContainerEdits(env=env, mounts=tuple(mounts), devices=tuple(nodes))
    for i, device in enumerate(devices):
        env[f"IX_DEVICE_MEMORY_LIMIT_{i}"] = f"{device.usedmem}m"
        env[f"IX_DEVICE_SM_LIMIT_{i}"] = str(device.usedcores if device.usedcores < 100 else 0)
    env["IX_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    if settings.libvcorex_log_level:
        env["IX_LOG_LEVEL"] = settings.libvcorex_log_level
    host = dirs(settings)
    accounting = host.accounting_dir(pod, index)
    mounts += library_mounts(library, settings.library_dir, LIBRARY_FILE, settings.hook_path)
    mounts.append(Mount(container_path=SHMEM_DIR, host_path=str(accounting), read_only=False))
    grant = from_limits([(d.usedmem, d.usedcores, d.uuid) for d in devices])
    grant_mount, files = grant_edits(host.grant_dir(pod, index), "iluvatar", grant)
    mounts.append(grant_mount)
    return ContainerEdits(env=env, mounts=tuple(mounts), devices=tuple(nodes),
                          accounting_file=str(accounting / ACCOUNTING_FILE), files=files)  # fmt: skip
