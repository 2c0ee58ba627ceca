"""Installing the vendors' isolation libraries on the host: versioned files, a stable name, a preload file.

A vendor names its library in `VendorInfo.isolation_library` and ships the file inside its installed Python
package: at the package's top level or in its `lib/` folder (`hami_vendor_nvidia/lib/libvgpu.so`). At
start-up the daemon installs it into `<hook-dir>/<vendor>/`:

    libvgpu-<distribution version>-<first 12 hex of its SHA-256>.so    the build, never written again
    libvgpu.so -> libvgpu-<version>-<digest>.so                           the stable name, a symlink
    ld.so.preload                                                          "<hook-dir>/<vendor>/libvgpu.so"

A running container has its library mapped, and rewriting a mapped file in place crashes it (HAMi's
upgrade overwrites `libvgpu.so`). Here a build gets its own file, written under a temporary name and renamed
into place; the stable name is a symlink switched atomically (a new link renamed over the old one); the
preload file is switched the same way, and only when its content changes. A bind mount resolves the symlink
when the container is created, so a running container keeps the build it started with while new containers
get the new one, and a container never sees half a file.

The container side belongs to the vendor: Allocate passes the installed paths to its `hami_container_edits`
as `library` (`hami.model.IsolationLibrary`), and the vendor decides when a container gets no library (an
opt-out, a hardware partition). The library appears inside the container at the same path as on the host:
mount `library.path` (`<hook-dir>/<vendor>/<library>`) at that same path and `library.preload_path`
(`<hook-dir>/<vendor>/ld.so.preload`) at `/etc/ld.so.preload`, which names it.

Old builds are not deleted: whether a container still maps one cannot be known from here.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from hami.model import IsolationLibrary
from hami.plugins import LoadedVendor

__all__ = ["PRELOAD_FILE", "InstalledLibrary", "IsolationLibraries", "library_source"]

log = logging.getLogger(__name__)

PRELOAD_FILE = "ld.so.preload"


@dataclass(frozen=True, slots=True)
class InstalledLibrary:
    """A vendor's isolation library as installed on the host."""

    vendor: str
    build_path: Path
    """The versioned file of this build."""
    path: Path
    """The stable name (a symlink to the build): what containers mount, at the same path."""
    preload_path: Path
    """The preload file naming `path`: what containers mount at `/etc/ld.so.preload`."""

    def for_containers(self) -> IsolationLibrary:
        """What the vendor's `hami_container_edits` is given as `library`."""
        return IsolationLibrary(path=str(self.path), preload_path=str(self.preload_path))


def library_source(vendor: LoadedVendor) -> Path | None:
    """The library file a vendor's installed package ships, or None when it names none or ships none."""
    name = vendor.info.isolation_library
    if not name:
        return None
    module_name = getattr(vendor.plugin, "__name__", None) or type(vendor.plugin).__module__
    module = sys.modules.get(str(module_name).split(".")[0])
    location = getattr(module, "__file__", None)
    if not location:
        return None
    root = Path(location).parent  # a package's folder, or the folder holding a single-module plugin
    for candidate in (root / name, root / "lib" / name):
        if candidate.is_file():
            return candidate
    return None


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sync_dir(directory: Path) -> None:
    """Make renames in `directory` durable."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, and rename it over `path`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.chmod(mode)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _sync_dir(path.parent)


def _link_atomically(path: Path, target: str) -> None:
    """Point the symlink `path` at `target` (relative), replacing whatever `path` was in one rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.link")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(target, tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _sync_dir(path.parent)


class IsolationLibraries:
    """The host hook directory and the libraries installed in it, by vendor name."""

    def __init__(self, hook_dir: Path) -> None:
        self.hook_dir = hook_dir
        self.installed: dict[str, InstalledLibrary] = {}

    def for_vendor(self, vendor: str) -> IsolationLibrary | None:
        """The library installed for `vendor`, as its container edits are given it; None when none is."""
        installed = self.installed.get(vendor)
        return None if installed is None else installed.for_containers()

    def install(self, vendor: LoadedVendor, source: Path | None = None) -> InstalledLibrary | None:
        """Install `vendor`'s library (from its package, or `source`); None when it has none to install.

        :raises OSError: the hook directory cannot be written.
        """
        name = vendor.info.isolation_library
        if not name:
            return None
        source = source or library_source(vendor)
        if source is None:
            log.warning(
                "vendor %s names isolation library %s but its package %s ships no such file (looked at the "
                "package's top level and lib/); its containers run without isolation",
                vendor.name,
                name,
                vendor.distribution,
            )
            return None
        base = Path(name).name
        stem, dot, suffix = base.partition(".")
        version = "".join(c if c.isalnum() or c in "._+" else "_" for c in (vendor.version or "0"))
        folder = self.hook_dir / vendor.name
        folder.mkdir(parents=True, exist_ok=True)
        build = folder / f"{stem}-{version}-{_digest(source)[:12]}{dot}{suffix}"
        if not build.exists():  # never rewrite: a running container may have this file mapped
            _write_atomically(build, source.read_bytes(), 0o755)
            log.info("installed isolation library of vendor %s as %s", vendor.name, build)
        stable = folder / base
        if not (stable.is_symlink() and os.readlink(stable) == build.name):
            _link_atomically(stable, build.name)
            log.info("%s now points at %s", stable, build.name)
        preload = folder / PRELOAD_FILE
        content = f"{stable}\n".encode()
        try:
            current = preload.read_bytes()
        except FileNotFoundError:
            current = None
        if current != content:
            _write_atomically(preload, content, 0o644)
        installed = InstalledLibrary(vendor.name, build, stable, preload)
        self.installed[vendor.name] = installed
        return installed
