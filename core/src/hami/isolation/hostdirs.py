"""A soft-mode container's host directories and library mounts, the same for every vendor's isolation library.

Owns, for a vendor whose node mode loads its isolation library into containers:

* where a container's accounting directory is (``<containers dir>/<pod uid>_<container>``, mounted writable into
  it) and where its grant is written (``<hook path>/grants/<pod uid>_<container>``, mounted read-only), both
  through `hami.hostpaths` so that a hostile pod UID or container name never leaves them;
* `prepare_accounting_dir`: that directory emptied and made world-writable at Allocate (whatever user the
  container runs as creates its accounting file there);
* `release_pod`: a finished pod's directories removed (a UID that is not a safe path component reaches no glob);
* `library_mounts`: the library and the ``/etc/ld.so.preload`` naming it, from the node daemon's installation
  (`hami.model.IsolationLibrary`) or a directory the vendor's settings name.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from hami.errors import HamiError
from hami.hostpaths import HostPathError, path_component, pod_path
from hami.model import IsolationLibrary, Mount, Pod

__all__ = [
    "PRELOAD_FILE",
    "accounting_dir",
    "container_name",
    "grant_dir",
    "library_mounts",
    "prepare_accounting_dir",
    "release_pod",
]

log = logging.getLogger(__name__)

PRELOAD_FILE = "ld.so.preload"


def container_name(pod: Pod, index: int) -> str:
    """The name of container `index` (init containers first), or ``container-<index>`` past the pod's list."""
    containers = pod.all_containers
    return containers[index].name if 0 <= index < len(containers) else f"container-{index}"


def _key(pod: Pod) -> tuple[str, str]:
    return (pod.uid, "pod UID") if pod.uid else (pod.name, "pod name")


def accounting_dir(containers_dir: Path, pod: Pod, index: int) -> Path:
    """Container `index`'s accounting directory. :raises HostPathError: a name would leave `containers_dir`."""
    return Path(pod_path(containers_dir, _key(pod), (container_name(pod, index), "container name")))


def grant_dir(hook_path: Path, pod: Pod, index: int) -> PurePosixPath:
    """Container `index`'s grant directory. :raises HostPathError: a name would leave ``<hook_path>/grants``."""
    return pod_path(hook_path / "grants", _key(pod), (container_name(pod, index), "container name"))


def prepare_accounting_dir(containers_dir: Path, pod: Pod, index: int) -> Path:
    """Container `index`'s accounting directory, empty and writable by any user.

    :raises HamiError: it cannot be made, or the pod's UID or container name would leave `containers_dir`."""
    try:
        path = accounting_dir(containers_dir, pod, index)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o777)
    except (HostPathError, OSError) as exc:
        raise HamiError(f"pod {pod.namespace}/{pod.name}: cannot prepare its accounting directory: {exc}") from None
    return path


def release_pod(pod: Pod, directories: Iterable[Path]) -> None:
    """Remove the pod's ``<uid>_*`` entries of `directories` (none: nothing to do)."""
    key = pod.uid or pod.name
    try:
        path_component(key, "pod UID")  # a hostile UID (`../x`, `*`) must not reach the glob below
    except HostPathError as exc:
        log.warning("not releasing pod %s/%s: %s", pod.namespace, pod.name, exc)
        return
    for directory in directories:
        try:
            found = sorted(directory.glob(f"{key}_*"))
        except OSError:
            continue
        for path in found:
            shutil.rmtree(path, ignore_errors=True)


def library_mounts(
    library: IsolationLibrary | None, library_dir: Path | None, library_file: str, setting: str
) -> list[Mount]:
    """The library and its preload file: `library_dir`'s (the vendor's setting `setting`) when set, else the node
    daemon's installation. :raises HamiError: neither is there, saying what to set."""
    if library_dir is not None:
        directory = PurePosixPath(library_dir)
        return [
            Mount(container_path=str(directory / library_file), host_path=str(directory / library_file)),
            Mount(container_path="/etc/ld.so.preload", host_path=str(directory / PRELOAD_FILE)),
        ]
    if library is None:
        raise HamiError(
            f"the soft mode needs {library_file}: the node daemon installed none (is the vendor's package installed "
            f"with its library?) and {setting} is not set"
        )
    return [
        Mount(container_path=library.path, host_path=library.path),
        Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path),
    ]
