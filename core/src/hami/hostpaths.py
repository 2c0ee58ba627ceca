"""Host paths named after pods: one component per pod string, checked to stay under its directory.

The node daemon and the vendors make host directories and files named from a pod's UID, namespace, name or
container names (accounting files, caches), and remove them when the pod is gone. The API server validates
those strings, but the daemon must not rely on it: a name is a path component only when it is made of
letters, digits, `.`, `_` and `-`, is not `.` or `..`, and fits a file name; the joined path must then be a
direct child of its directory. Anything else is refused with `HostPathError`, saying which string and why.

Every vendor uses this instead of its own joining (`pod_path`), so the rule is written once.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from hami.errors import HamiError
from hami.model import Pod

__all__ = ["HostPathError", "container_dir", "fresh_shared_dir", "path_component", "pod_path", "remove_pod_dirs"]

_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
_MAX = 255


class HostPathError(HamiError):
    """A pod string cannot name a host path: it would leave its directory, or is not a plain file name."""


def path_component(value: str, what: str) -> str:
    """`value` when it is a safe single path component; :raises HostPathError: otherwise (`what` names it)."""
    if not value:
        raise HostPathError(f"{what} is empty: it cannot name a host path")
    if len(value.encode()) > _MAX:
        raise HostPathError(f"{what} has {len(value.encode())} bytes: a host path component has at most {_MAX}")
    if value in (".", "..") or not _COMPONENT.fullmatch(value):
        raise HostPathError(
            f"{what} {value!r} cannot name a host path: only letters, digits, '.', '_' and '-' are allowed, and "
            "not '.' or '..' alone (Kubernetes names and UIDs always qualify; was the pod written by hand?)"
        )
    return value


def pod_path(directory: str | os.PathLike[str], *parts: tuple[str, str], separator: str = "_") -> PurePosixPath:
    """`directory` / the checked `parts` joined by `separator` (each part: its value and what it is).

    For example `pod_path(d, (uid, "pod UID"), (name, "container name"))` is `d/<uid>_<name>`.
    :raises HostPathError: a part is not a safe component, or the result would not be a child of `directory`."""
    base = PurePosixPath(directory)
    name = separator.join(path_component(value, what) for value, what in parts)
    path = base / path_component(name, "the host file name " + " and ".join(what for _, what in parts))
    if path.parent != base:
        raise HostPathError(f"{path} is not directly under {base}")
    return path


def container_dir(directory: str | os.PathLike[str], pod: Pod, index: int) -> PurePosixPath:
    """`directory` / ``<pod UID>_<container name>`` (the pod's name without a UID) for container `index` (init
    containers first; ``container-<index>`` past the pod's containers), the form of the isolation libraries'
    accounting and grant directories. :raises HostPathError: as `pod_path`."""
    key = (pod.uid, "pod UID") if pod.uid else (pod.name, "pod name")
    containers = pod.all_containers
    name = containers[index].name if 0 <= index < len(containers) else f"container-{index}"
    return pod_path(directory, key, (name, "container name"))


def fresh_shared_dir(path: str | os.PathLike[str]) -> None:
    """Make `path` empty and writable by every user (mode 0777), the host side of a container's accounting
    directory, which whatever user the container runs as must be able to write. :raises HamiError: it cannot."""
    where = Path(path)
    try:
        shutil.rmtree(where, ignore_errors=True)
        where.mkdir(parents=True, exist_ok=True)
        os.chmod(where, 0o777)
    except OSError as exc:
        raise HamiError(f"cannot prepare the container directory {where}: {exc}") from None


def remove_pod_dirs(pod: Pod, *directories: str | os.PathLike[str]) -> None:
    """Remove the pod's container directories (`container_dir`'s ``<pod UID>_*``) from each of `directories`; a pod
    whose UID cannot name a host path is left alone (logged), and a missing directory is no error."""
    key = pod.uid or pod.name
    try:
        path_component(key, "pod UID")  # a hostile UID (`../x`, `*`) must not reach the glob below
    except HostPathError as exc:
        logging.getLogger(__name__).warning("not removing directories of pod %s/%s: %s", pod.namespace, pod.name, exc)
        return
    if "_" in key:  # `<key>_*` would also match another pod's directories
        return
    for directory in directories:
        try:
            found = sorted(Path(directory).glob(f"{key}_*"))
        except OSError:
            continue
        for path in found:
            shutil.rmtree(path, ignore_errors=True)
