"""Allocation on the node: what a soft-split container needs on the host before it starts, and its removal.

Owns the host side of the soft split's accounting: each soft-split container gets its own directory
``<hookPath>/containers/<pod uid>_<container>`` (emptied and made world-writable, as HAMi's device plugin does, so
that whatever user the container runs as can create its accounting file there), mounted by the container edits at
``/hami-vnpu-shmem``. `release` removes the directories of a finished pod; it tolerates a pod that was never
allocated or was already released. Template-mode and whole-card containers need nothing here: Ascend's container
runtime creates a template's vNPU itself when the container starts.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from hami.errors import HamiError, RequestError
from hami.hostpaths import HostPathError, path_component
from hami.model import ContainerPlacement, Pod
from hami_vendor_ascend.admission import vnpu_mode
from hami_vendor_ascend.edits import accounting_dir
from hami_vendor_ascend.settings import SOFT_SPLIT, AscendSettings

__all__ = ["allocate", "release"]

log = logging.getLogger("hami_vendor_ascend")


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
    path = Path(accounting_dir(settings, pod, container_index))
    try:
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o777)  # the container's user, whoever it is, writes its accounting file here
    except OSError as exc:
        raise HamiError(f"cannot prepare the NPU accounting directory {path}: {exc}") from None


def release(settings: AscendSettings, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    """Remove the accounting and grant directories of a finished pod: every ``<pod uid>_<container>`` directory
    (a pod that is gone is known by its UID only, not by its containers' names; neither a UID nor a Kubernetes
    name has ``_``, so the prefix names exactly this pod's directories)."""
    key = pod.uid or pod.name
    try:
        path_component(key, "pod UID")
    except HostPathError:
        return  # no directory of ours can be named by it
    if "_" in key:
        return
    try:
        found = sorted(Path(settings.containers_dir).glob(f"{key}_*"))
        found += sorted((Path(settings.hook_path) / "grants").glob(f"{key}_*"))  # grant_host_dir's
    except OSError:
        return
    for path in found:
        shutil.rmtree(path, ignore_errors=True)
        log.debug("removed the accounting directory %s of pod %s/%s", path, pod.namespace, pod.name)
