"""A node's per-container host directories for an isolation library, and the mounts that bring the library in.

Owns what every vendor's soft (isolation-library) mode does the same way on the host: one accounting directory per
container, ``<root>/containers/<pod uid>_<container>`` (emptied and made world-writable at Allocate, so whatever
user the container runs as can create its accounting file there; mounted writable), one grant directory per
container, ``<root>/grants/<pod uid>_<container>`` (written by the node daemon from ``ContainerEdits.files``,
mounted read-only at ``/etc/hami/grant``), both removed when the pod is released (and, after a restart, those of
pods no longer on the node: `ContainerDirs.keep_only`), and the mounts of the library
with the ``/etc/ld.so.preload`` naming it (the library the node daemon installed, else the one in a configured
directory). Host paths go through `hami.hostpaths`, so a hostile pod UID or container name cannot leave `root`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from hami.errors import HamiError
from hami.hostpaths import HostPathError, path_component, pod_path
from hami.model import IsolationLibrary, Mount, Pod

__all__ = ["ContainerDirs", "container_name", "library_mounts"]

log = logging.getLogger("hami.isolation")


def container_name(pod: Pod, index: int) -> str:
    """The name of container `index` (init containers first), or ``container-<index>`` when there is none."""
    containers = pod.all_containers
    return containers[index].name if 0 <= index < len(containers) else f"container-{index}"


def _pod_key(pod: Pod) -> tuple[str, str]:
    return (pod.uid, "pod UID") if pod.uid else (pod.name, "pod name")


@dataclass(frozen=True)
class ContainerDirs:
    """The per-container directories under one root (a vendor's ``hookPath``)."""

    root: Path
    what: str = "device"
    """For messages: whose accounting directory (``GPU``, ``DCU``)."""

    @property
    def containers(self) -> Path:
        return self.root / "containers"

    @property
    def grants(self) -> Path:
        return self.root / "grants"

    def accounting_dir(self, pod: Pod, index: int) -> Path:
        """Container `index`'s accounting directory. :raises HostPathError: the UID or name would leave the root."""
        return Path(pod_path(self.containers, _pod_key(pod), (container_name(pod, index), "container name")))

    def grant_dir(self, pod: Pod, index: int) -> PurePosixPath:
        """Container `index`'s grant directory (outside its accounting directory). :raises HostPathError: as above."""
        return pod_path(self.grants, _pod_key(pod), (container_name(pod, index), "container name"))

    def prepare(self, pod: Pod, index: int) -> Path:
        """Empty container `index`'s accounting directory and make it world-writable; returns it.

        :raises HamiError: it cannot be made (the message names it)."""
        path = self.accounting_dir(pod, index)
        try:
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, 0o777)  # the container's user, whoever it is, writes its accounting file here
        except OSError as exc:
            raise HamiError(f"cannot prepare the {self.what} accounting directory {path}: {exc}") from None
        return path

    def release(self, pod: Pod) -> None:
        """Remove every accounting and grant directory of `pod` (none made, or already removed, is fine)."""
        key, what = _pod_key(pod)
        try:
            path_component(key, what)  # a hostile UID (`../x`, `*`) must not reach the glob below
        except HostPathError as exc:
            log.warning("not releasing the directories of pod %s/%s: %s", pod.namespace, pod.name, exc)
            return
        if "_" in key:  # neither a UID nor a Kubernetes name has one: `<key>_*` would name others' directories
            return
        for directory in (self.containers, self.grants):
            try:
                found = sorted(directory.glob(f"{key}_*"))
            except OSError:
                continue
            for path in found:
                shutil.rmtree(path, ignore_errors=True)

    def keep_only(self, pods: Sequence[Pod]) -> list[str]:
        """After a restart: remove the accounting and grant directories of every pod not in `pods` (those still on
        the node); returns the names removed. A directory is ``<pod uid>_<container>`` (the pod's name where it
        has no UID), and neither a UID nor a Kubernetes name holds ``_``."""
        live = {_pod_key(p)[0] for p in pods}
        removed: list[str] = []
        for directory in (self.containers, self.grants):
            try:
                found = sorted(directory.iterdir())
            except OSError:
                continue
            for path in found:
                if path.name.split("_", 1)[0] not in live:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path.name)
        return removed


def library_mounts(
    library: IsolationLibrary | None,
    directory: str | os.PathLike[str] | None,
    file: str,
    fallback: str | os.PathLike[str],
) -> list[Mount]:
    """The isolation library and the ``/etc/ld.so.preload`` naming it: the library the node daemon installed, or,
    with `directory` set (else `fallback` when no library is installed), ``<directory>/<file>`` and
    ``<directory>/ld.so.preload``."""
    if library is not None and directory is None:
        return [
            Mount(container_path=library.path, host_path=library.path),
            Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path),
        ]
    base = PurePosixPath(directory if directory is not None else fallback)
    return [
        Mount(container_path=str(base / file), host_path=str(base / file)),
        Mount(container_path="/etc/ld.so.preload", host_path=str(base / "ld.so.preload")),
    ]
