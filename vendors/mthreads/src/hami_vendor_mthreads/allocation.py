"""Allocation on the node: what a Moore Threads container needs on the host before it starts, and its removal.

Owns, in ``hami-core`` mode (the isolation library), the container's host directories: its accounting directory
``<hookPath>/containers/<pod uid>_<container>``, emptied and made world-writable at Allocate so that whatever user
the container runs as can create its accounting file there, and its grant directory ``<hookPath>/grants/…``
(written by the node daemon from `hami_vendor_mthreads.edits`). `release` removes both for a finished pod
(tolerating a pod never allocated or already released). In ``sgpu`` mode (HAMi's) nothing is made on the host: Moore
Threads' own components hold the share.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from hami.isolation.containers import ContainerDirs
from hami.model import ContainerPlacement, Pod
from hami_vendor_mthreads.discovery import runtime_for
from hami_vendor_mthreads.settings import SOFT, MthreadsSettings

__all__ = ["accounting_dir", "allocate", "dirs", "grant_dir", "release"]


def dirs(settings: MthreadsSettings) -> ContainerDirs:
    """The soft mode's per-container directories under ``hookPath`` (core's `hami.isolation.containers`)."""
    return ContainerDirs(settings.hook_path, "Moore Threads GPU")


def accounting_dir(settings: MthreadsSettings, pod: Pod, index: int) -> Path:
    """:raises HostPathError: the pod UID or container name would leave the directory."""
    return dirs(settings).accounting_dir(pod, index)


def grant_dir(settings: MthreadsSettings, pod: Pod, index: int) -> PurePosixPath:
    """The container's grant directory, outside its accounting directory (mounted read-only)."""
    return dirs(settings).grant_dir(pod, index)


def allocate(settings: MthreadsSettings, pod: Pod, container_index: int, devices: ContainerPlacement) -> None:
    if not devices or settings.sharing_mode != SOFT:
        return
    runtime_for(settings).gpus_of([d.uuid for d in devices])
    dirs(settings).prepare(pod, container_index)


def release(settings: MthreadsSettings, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    dirs(settings).release(pod)
