"""A /proc tree for tests of the kernel's DRM client statistics: processes in a pod's cgroup, their descriptors, and
the fdinfo of each, written in the format of Linux's ``Documentation/gpu/drm-usage-stats.rst``.

What the node daemon's fdinfo reader (`hami.drmfdinfo.read_process`) and the backstop (`hami.node.backstop`) are
pointed at in place of the host's /proc (``procRoot``): the reader follows each descriptor's link and reads the
fdinfo of those open on a character device, so a DRM descriptor here links to ``/dev/null`` (a character device every
machine has, with no DRM statistics of its own) and its fdinfo file says what a driver would print.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hami.testing.backstop import systemd_cgroup

__all__ = ["FakeProc", "fdinfo_text"]


def fdinfo_text(
    driver: str,
    pdev: str,
    client_id: int | None,
    *,
    memory: Mapping[str, str] | None = None,
    engines: Mapping[str, int] | None = None,
) -> str:
    """One open DRM file's fdinfo: the generic lines, then ``drm-driver``, ``drm-pdev``, ``drm-client-id`` (left out
    when None), ``drm-<key>: <value>`` per `memory` entry (``{"resident-vram": "300 MiB"}``) and
    ``drm-engine-<engine>: <ns> ns`` per engine."""
    lines = ["pos:\t0", "flags:\t02100002", "mnt_id:\t26", "ino:\t1093", f"drm-driver:\t{driver}", f"drm-pdev:\t{pdev}"]
    if client_id is not None:
        lines.append(f"drm-client-id:\t{client_id}")
    lines += [f"drm-{key}:\t{value}" for key, value in (memory or {}).items()]
    lines += [f"drm-engine-{engine}:\t{ns} ns" for engine, ns in (engines or {}).items()]
    return "\n".join(lines) + "\n"


@dataclass
class FakeProc:
    """A /proc tree at `root`: processes with a cgroup record, descriptors (links) and their fdinfo."""

    root: Path
    files: Path = field(init=False)
    """Where the regular files that descriptors may link to are written."""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.files = self.root.parent / f"{self.root.name}-files"
        self.files.mkdir(exist_ok=True)

    def process(self, pid: int, pod_uid: str = "", container_id: str = "a" * 64) -> Path:
        """Process `pid`, in the cgroup of container `container_id` of pod `pod_uid` (the kubelet's systemd layout),
        or, without a pod, a host service's."""
        base = self.root / str(pid)
        (base / "fd").mkdir(parents=True, exist_ok=True)
        (base / "fdinfo").mkdir(exist_ok=True)
        record = systemd_cgroup(pod_uid, container_id) if pod_uid else "0::/system.slice/sshd.service\n"
        (base / "cgroup").write_text(record)
        return base

    def drm(self, pid: int, fd: int, text: str) -> None:
        """Descriptor `fd` of `pid` open on a DRM device, its fdinfo `text` (written again when it exists)."""
        base = self.root / str(pid)
        link = base / "fd" / str(fd)
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
        (base / "fdinfo" / str(fd)).write_text(text)

    def other(self, pid: int, fd: int, target: str, text: str = "pos:\t0\nflags:\t02\n") -> None:
        """Descriptor `fd` of `pid` linking to `target` (a file, or an anonymous object's name like
        ``socket:[81234]``, which no path reaches), its fdinfo `text`."""
        base = self.root / str(pid)
        (base / "fd" / str(fd)).symlink_to(target)
        (base / "fdinfo" / str(fd)).write_text(text)
