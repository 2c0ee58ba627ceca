"""The soft mode (``mluMode: hami-core``): what an MLU container needs on the host and gets for libvmlu.so.

Owns, for a node in this project's soft mode:

* `prepare` (at Allocate): the container's accounting directory ``<hookPath>/containers/<pod uid>_<container>``,
  emptied and made world-writable, so that whatever user the container runs as creates its accounting file there;
* `release`: a finished pod's accounting directories and grants removed (a hostile pod UID never reaches a glob);
  both through core's `hami.isolation.containers`;
* `container_edits`: the device nodes of the whole cards (`hami_vendor_cambricon.allocation`'s), the isolation
  library ``libvmlu.so`` and the ``/etc/ld.so.preload`` naming it (the library the node daemon installed, else
  ``libraryDir``), the accounting directory at ``/hami-vmlu-shmem``, the library's environment
  (``CAMBRICON_DEVICE_MEMORY_LIMIT_<i>=<MiB>m``, ``CAMBRICON_DEVICE_CORE_LIMIT_<i>`` (0 for a whole card's compute),
  ``CAMBRICON_DEVICE_MEMORY_SHARED_CACHE``, ``CAMBRICON_DEVICE_UUIDS``, ``LIBVMLU_LOG_LEVEL``) and the container's
  grant (`hami.isolation.grant`: the same limits, written by the node daemon in
  ``<hookPath>/grants/<pod uid>_<container>/cambricon.grant`` and mounted read-only at ``/etc/hami/grant``), which
  the library reads first: the environment, which the tenant controls, can then only lower a limit.

No sMLU instance is made in this mode: the cards are passed through whole and the library enforces the shares.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hami.errors import HamiError
from hami.hostpaths import HostPathError
from hami.isolation.containers import ContainerDirs, library_mounts
from hami.isolation.grant import from_limits, grant_edits
from hami.model import ContainerEdits, ContainerPlacement, IsolationLibrary, Mount, Pod
from hami_vendor_cambricon.settings import CambriconSettings

__all__ = ["ACCOUNTING_FILE", "LIBRARY_FILE", "SHMEM_DIR", "accounting_dir", "container_edits", "prepare", "release"]

LIBRARY_FILE = "libvmlu.so"
SHMEM_DIR = "/hami-vmlu-shmem"
ACCOUNTING_FILE = "vmlu.cache"


def _dirs(settings: CambriconSettings) -> ContainerDirs:
    return ContainerDirs(settings.hook_path, "MLU")


def accounting_dir(settings: CambriconSettings, pod: Pod, index: int) -> Path:
    """The host directory of container `index`'s accounting file (mounted writable into it).

    :raises HostPathError: the pod UID or container name would leave the containers directory."""
    return _dirs(settings).accounting_dir(pod, index)


def prepare(settings: CambriconSettings, pod: Pod, index: int) -> None:
    """The container's accounting directory, empty and writable by any user. :raises HamiError: it cannot be."""
    try:
        _dirs(settings).prepare(pod, index)
    except HostPathError as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: {exc}") from None


def release(settings: CambriconSettings, pod: Pod) -> None:
    """Remove the pod's accounting directories and grants (none: nothing to do)."""
    _dirs(settings).release(pod)


def container_edits(
    settings: CambriconSettings,
    pod: Pod,
    index: int,
    devices: ContainerPlacement,
    cards: ContainerEdits,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    """The soft mode's edits of container `index`: `cards` (the whole cards' env, nodes and mounts) plus the
    library, its accounting directory, environment and grant.

    :raises HamiError: no library to mount, or a host path the pod's names would escape."""
    limits: Sequence[tuple[int, int, str]] = [(d.usedmem, d.usedcores, d.uuid) for d in devices]
    env = dict(cards.env)
    for i, (memory, cores, _) in enumerate(limits):
        env[f"CAMBRICON_DEVICE_MEMORY_LIMIT_{i}"] = f"{memory}m"
        env[f"CAMBRICON_DEVICE_CORE_LIMIT_{i}"] = str(cores if cores < 100 else 0)  # a whole card: no limit
    env["CAMBRICON_DEVICE_MEMORY_SHARED_CACHE"] = f"{SHMEM_DIR}/{ACCOUNTING_FILE}"
    env["CAMBRICON_DEVICE_UUIDS"] = ",".join(d.uuid for d in devices)
    if settings.libvmlu_log_level:
        env["LIBVMLU_LOG_LEVEL"] = settings.libvmlu_log_level
    try:
        host_dir = accounting_dir(settings, pod, index)
        grant_mount, files = grant_edits(_dirs(settings).grant_dir(pod, index), "cambricon",
                                         from_limits(limits))  # fmt: skip
    except HostPathError as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: {exc}") from None
    if library is None and settings.library_dir is None:
        raise HamiError(
            f"the soft mode needs {LIBRARY_FILE}: the node daemon installed none (is hami-vendor-cambricon installed "
            "with its library?) and cambricon.libraryDir is not set"
        )
    lib_dir = settings.library_dir
    mounts = [*cards.mounts, *library_mounts(library, lib_dir, LIBRARY_FILE, fallback=lib_dir or "")]
    mounts += [Mount(container_path=SHMEM_DIR, host_path=str(host_dir), read_only=False), grant_mount]
    return ContainerEdits(env=env, devices=cards.devices, mounts=tuple(mounts),
                          accounting_file=str(host_dir / ACCOUNTING_FILE), files=files)  # fmt: skip
