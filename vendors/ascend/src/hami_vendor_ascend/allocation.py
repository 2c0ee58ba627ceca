"""Allocation on the node: what a soft-split container needs on the host before it starts, and its removal.

Owns the host side of the soft split's accounting: each soft-split container gets its own directory
``<hookPath>/containers/<pod uid>_<container>`` (emptied and made world-writable, as HAMi's device plugin does, so
that whatever user the container runs as can create its accounting file there), mounted by the container edits at
``/hami-vnpu-shmem``. `release` removes the directories of a finished pod; it tolerates a pod that was never
allocated or was already released. Template-mode and whole-card containers need nothing here: Ascend's container
runtime creates a template's vNPU itself when the container starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from hami.errors import HamiError, RequestError
from hami.isolation.containers import ContainerDirs
from hami.model import ContainerPlacement, Pod
from hami_vendor_ascend.admission import vnpu_mode
from hami_vendor_ascend.settings import SOFT_SPLIT, AscendSettings

__all__ = ["allocate", "release"]


def allocate(settings: AscendSettings, pod: Pod, container_index: int, devices: ContainerPlacement) -> None:
    """Prepare container `container_index`'s accounting directory when it runs in soft-split mode."""
    if not devices:
        return
    try:
        mode = vnpu_mode(pod, settings)
    except RequestError as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: {exc}") from None
    if mode != SOFT_SPLIT:
        return
    ContainerDirs(settings.hook_path, "NPU").prepare(pod, container_index)


def release(settings: AscendSettings, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    """Remove the accounting and grant directories of a finished pod: every ``<pod uid>_<container>`` directory
    (a pod that is gone is known by its UID only, not by its containers' names; neither a UID nor a Kubernetes
    name has ``_``, so the prefix names exactly this pod's directories)."""
    ContainerDirs(settings.hook_path, "NPU").release(pod)
