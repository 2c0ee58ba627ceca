"""The distribution packages (packaging/build_packages.py): the .deb built with dpkg-deb, installed with
``dpkg --root`` into a temporary root (a root install would change this machine's own package database: the test
asks dpkg for the same work on an empty one), its files and dpkg's record of them checked, then removed and purged
without a trace; the .rpm the same way with ``rpm --root`` where rpmbuild is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "packaging" / "build_packages.py"
LIBRARIES = {
    "nvidia": "libvgpu.so",
    "ascend": "libvnpu.so",
    "hygon": "libvdcu.so",
    "cambricon": "libvmlu.so",
    "iluvatar": "libvcorex.so",
    "mthreads": "libvmusa.so",
    "metax": "libvmaca.so",
    "amd": "libamvgpu.so",
}


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str | None]:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed: the .deb cannot be built here")
    out = tmp_path_factory.mktemp("packages")
    report: dict[str, str | None] = json.loads(_run(sys.executable, str(SCRIPT), str(out)).splitlines()[-1])
    return report


def _check_installed(root: Path) -> None:
    for vendor, name in LIBRARIES.items():
        stable = root / "usr" / "lib" / "hami" / vendor / name
        assert stable.is_symlink()
        build = stable.parent / os.readlink(stable)
        assert build.is_file()
        assert build.read_bytes()[:4] == b"\x7fELF"
        assert (stable.parent / "ld.so.preload").read_text() == f"/usr/lib/hami/{vendor}/{name}\n"
        spec = json.loads((root / "etc" / "cdi" / f"hami-{vendor}.json").read_text())
        assert spec["kind"] == f"hami.io/{vendor}"
    assert not (root / "etc" / "ld.so.preload").exists(), "the package never preloads into the whole host"


def test_the_deb_installs_into_a_root_and_removes_cleanly(packages: dict[str, str | None], tmp_path: Path) -> None:
    deb = str(packages["deb"])
    info = _run("dpkg-deb", "--field", deb, "Package", "Version", "Depends")
    assert info.splitlines()[0] == "Package: hami-isolation"
    root = tmp_path / "root"
    admin = root / "var" / "lib" / "dpkg"
    for sub in ("info", "updates", "triggers"):
        (admin / sub).mkdir(parents=True)
    (admin / "status").touch()
    (admin / "available").touch()
    dpkg = ["dpkg", f"--root={root}", "--force-not-root", "--force-depends", "--force-script-chrootless"]
    _run(*dpkg, "--install", deb)
    _check_installed(root)
    listed = set(_run(*dpkg, "--listfiles", "hami-isolation").split())
    assert {f"/usr/lib/hami/{v}/{n}" for v, n in LIBRARIES.items()} <= listed
    assert "Status: install ok installed" in _run(*dpkg, "--status", "hami-isolation")
    assert (admin / "info" / "hami-isolation.conffiles").read_text().split() == sorted(
        f"/etc/cdi/hami-{v}.json" for v in LIBRARIES
    )
    _run(*dpkg, "--remove", "hami-isolation")
    assert not (root / "usr" / "lib" / "hami").exists()
    assert (root / "etc" / "cdi" / "hami-nvidia.json").exists(), "remove keeps the configuration files"
    _run(*dpkg, "--purge", "hami-isolation")
    assert not (root / "usr" / "lib" / "hami").exists()
    assert not list((root / "etc").rglob("hami-*.json")), "purge removes them"


def test_the_rpm_installs_into_a_root_and_erases_cleanly(packages: dict[str, str | None], tmp_path: Path) -> None:
    if packages["rpm"] is None or shutil.which("rpm") is None:
        pytest.skip("rpmbuild is not installed: the .rpm was not built here")
    rpm, root = str(packages["rpm"]), tmp_path / "root"
    root.mkdir()
    _run("rpm", "--root", str(root), "--initdb")
    _run("rpm", "--root", str(root), "--install", "--nodeps", rpm)
    _check_installed(root)
    assert _run("rpm", "--root", str(root), "--query", "hami-isolation").startswith("hami-isolation-")
    _run("rpm", "--root", str(root), "--erase", "hami-isolation")
    assert not (root / "usr" / "lib" / "hami").exists()
    assert not list((root / "etc").rglob("hami-*.json"))
