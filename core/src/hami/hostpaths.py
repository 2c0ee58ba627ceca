"""Host paths named after pods: one component per pod string, checked to stay under its directory.

The node daemon and the vendors make host directories and files named from a pod's UID, namespace, name or
container names (accounting files, caches), and remove them when the pod is gone. The API server validates
those strings, but the daemon must not rely on it: a name is a path component only when it is made of
letters, digits, `.`, `_` and `-`, is not `.` or `..`, and fits a file name; the joined path must then be a
direct child of its directory. Anything else is refused with `HostPathError`, saying which string and why.

Every vendor uses this instead of its own joining (`pod_path`), so the rule is written once.
"""

from __future__ import annotations

import os
import re
from pathlib import PurePosixPath

from hami.errors import HamiError

__all__ = ["HostPathError", "path_component", "pod_path"]

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
