"""Build the distribution packages of the isolation libraries: ``hami-isolation_<version>_<arch>.deb`` and, where
``rpmbuild`` is installed, ``hami-isolation-<version>-1.<arch>.rpm``.

Usage: ``python packaging/build_packages.py OUT_DIR [--vendor NAME]... [--no-rpm]``; prints one JSON object (the
files built) as its last line.

The tree is laid out by the project's own installer, ``hami host install --prefix <staging> --libdir /usr/lib/hami
--write`` (hami.host.install): each installed vendor's library as a versioned build, its stable symlink and its
``ld.so.preload`` under ``/usr/lib/hami/<vendor>/``, and a CDI specification per vendor under ``/etc/cdi/``
(configuration files: kept on upgrade when changed, removed on purge). Nothing is written to the host's
``/etc/ld.so.preload``: a package must not preload a library into every process of the host.

Tools: the ``.deb`` is built by ``dpkg-deb``, Debian's own archive builder (part of dpkg, on every Debian and
Ubuntu machine and image, so the build needs nothing else and its output is what dpkg itself expects); the ``.rpm``
by ``rpmbuild`` (rpm's own builder) from a spec written here whose ``%files`` list the same tree. A third tool that
writes both (nfpm, fpm) would add a toolchain to the build for two formats whose own builders are a command each.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NAME = "hami-isolation"
LIBDIR = "/usr/lib/hami"
SUMMARY = "HAMi isolation libraries: device memory and compute limits for processes and containers"
DESCRIPTION = (
    "The vendors' isolation libraries of the hami project (libvgpu.so, libvnpu.so, libvdcu.so, ...), installed\n"
    "under versioned paths in /usr/lib/hami/<vendor>/, and CDI specifications (/etc/cdi/hami-<vendor>.json) that\n"
    "give a container a library. Limits come from a grant (hami run, or a grant directory mounted at\n"
    "/etc/hami/grant) or, as with HAMi-core, from the container's environment. See docs/host.md."
)


def _run(argv: list[str], **kwargs: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode:
        raise SystemExit(f"build_packages: {' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return str(done.stdout)


def stage(root: Path, vendors: list[str]) -> list[dict[str, str]]:
    """Lay the package's tree out under `root`; the libraries installed (hami host install's JSON)."""
    argv = [
        sys.executable,
        "-m",
        "hami.cli",
        "host",
        "install",
        "--prefix",
        str(root),
        "--libdir",
        LIBDIR,
        "--write",
        "--json",
    ]
    for vendor in vendors:
        argv += ["--vendor", vendor]
    libraries: list[dict[str, str]] = json.loads(_run(argv))["libraries"]
    if not libraries:
        raise SystemExit("build_packages: no installed vendor ships an isolation library: nothing to package")
    return libraries


def _version() -> str:
    from importlib.metadata import version

    return version("hami-core")


def build_deb(root: Path, out: Path, version: str) -> Path:
    arch = _run(["dpkg", "--print-architecture"]).strip()
    control = root / "DEBIAN"
    control.mkdir(mode=0o755)
    conffiles = sorted("/" + str(p.relative_to(root)) for p in (root / "etc").rglob("*") if p.is_file())
    (control / "control").write_text(
        f"Package: {NAME}\nVersion: {version}\nArchitecture: {arch}\nMaintainer: hami maintainers <hami@localhost>\n"
        f"Section: libs\nPriority: optional\nDepends: libc6\nDescription: {SUMMARY}\n"
        + "".join(f" {line or '.'}\n" for line in DESCRIPTION.splitlines())
    )
    (control / "conffiles").write_text("".join(f"{c}\n" for c in conffiles))
    target = out / f"{NAME}_{version}_{arch}.deb"
    _run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(target)])
    shutil.rmtree(control)
    return target


def build_rpm(root: Path, out: Path, version: str) -> Path | None:
    rpmbuild = shutil.which("rpmbuild")
    if rpmbuild is None:
        return None
    top = Path(tempfile.mkdtemp(prefix="hami-rpm-"))
    try:
        entries = []
        for path in sorted(root.rglob("*")):
            final = "/" + str(path.relative_to(root))
            if path.is_dir() and not path.is_symlink():
                if final.startswith(LIBDIR):
                    entries.append(f"%dir {final}")
            elif final.startswith("/etc/"):
                entries.append(f"%config(noreplace) {final}")
            else:
                entries.append(final)
        spec = top / f"{NAME}.spec"
        spec.write_text(
            f"Name: {NAME}\nVersion: {version}\nRelease: 1\nSummary: {SUMMARY}\nLicense: Apache-2.0\n"
            "AutoReqProv: no\n\n"
            f"%description\n{DESCRIPTION}\n\n"
            f"%install\nmkdir -p %{{buildroot}}\ncp -a {root}/. %{{buildroot}}/\n\n"
            "%files\n" + "\n".join(entries) + "\n"
        )
        _run(
            [
                rpmbuild,
                "-bb",
                "--define",
                f"_topdir {top}",
                "--define",
                "debug_package %{nil}",
                "--define",
                "__os_install_post %{nil}",
                "--define",
                "_build_id_links none",
                str(spec),
            ]
        )
        (built,) = (top / "RPMS").rglob("*.rpm")
        target = out / built.name
        shutil.move(built, target)
        return target
    finally:
        shutil.rmtree(top, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory for the packages")
    parser.add_argument("--vendor", action="append", default=[], help="only this vendor's library (repeatable)")
    parser.add_argument("--no-rpm", action="store_true", help="build the .deb only")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    version = _version()
    with tempfile.TemporaryDirectory(prefix="hami-package-") as staging:
        root = Path(staging) / "root"
        root.mkdir(mode=0o755)
        libraries = stage(root, args.vendor)
        deb = build_deb(root, args.out, version)
        rpm = None if args.no_rpm else build_rpm(root, args.out, version)
    report = {"deb": str(deb), "rpm": str(rpm) if rpm else None, "vendors": [lib["vendor"] for lib in libraries]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
