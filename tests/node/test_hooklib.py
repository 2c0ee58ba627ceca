"""Isolation-library installation: versioned builds never rewritten, a stable name and a preload file switched
atomically."""

from __future__ import annotations

import importlib
import os
import stat
from pathlib import Path

import pytest
from node_harness import build_library
from scripted_vendor import INFO

from hami.model import VendorInfo
from hami.node.hooklib import IsolationLibraries, library_source
from hami.plugins import LoadedVendor


def vendor(plugin: object, version: str = "1.2.0", library: str | None = "libscripted.so") -> LoadedVendor:
    info = VendorInfo(name="scripted", display_name="Scripted", kinds=INFO.kinds, isolation_library=library)
    return LoadedVendor(info, plugin, "hami-vendor-scripted", version, ())


def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, library: Path, folder: str) -> object:
    """A vendor package `name` on sys.path shipping `library` in `folder` ('' for its top level)."""
    package = tmp_path / "site" / name
    (package / folder).mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / folder / library.name).write_bytes(library.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return importlib.import_module(name)


@pytest.mark.parametrize("folder", ["", "lib"])
def test_the_library_is_found_inside_the_vendor_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, folder: str
) -> None:
    library = build_library(tmp_path / "build")
    module = packaged(tmp_path, monkeypatch, f"hooklib_vendor_{folder or 'top'}", library, folder)
    found = library_source(vendor(module))
    assert found is not None
    assert found.read_bytes() == library.read_bytes()
    assert found.parent.name == (folder or f"hooklib_vendor_{folder or 'top'}")


def test_install_writes_a_versioned_build_a_stable_name_and_a_preload_file(tmp_path: Path) -> None:
    library = build_library(tmp_path / "build")
    hooks = IsolationLibraries(tmp_path / "hooks")
    installed = hooks.install(vendor(object(), version="1.2.0+local"), source=library)
    assert installed is not None
    folder = tmp_path / "hooks" / "scripted"
    assert installed.build_path.parent == folder
    assert installed.build_path.name.startswith("libscripted-1.2.0+local-")
    assert installed.build_path.suffix == ".so"
    assert installed.build_path.read_bytes() == library.read_bytes()
    assert stat.S_IMODE(installed.build_path.stat().st_mode) == 0o755
    assert installed.path == folder / "libscripted.so"
    assert os.readlink(installed.path) == installed.build_path.name  # relative: the folder may be mounted anywhere
    assert installed.preload_path.read_text() == f"{folder}/libscripted.so\n"
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [installed.build_path.name, "libscripted.so", "ld.so.preload"]
    )


def test_installing_the_same_build_again_touches_nothing(tmp_path: Path) -> None:
    library = build_library(tmp_path / "build")
    first = IsolationLibraries(tmp_path / "hooks").install(vendor(object()), source=library)
    assert first is not None
    paths = (first.build_path, first.path, first.preload_path)
    before = [(s.st_ino, s.st_mtime_ns) for s in (os.lstat(p) for p in paths)]
    second = IsolationLibraries(tmp_path / "hooks").install(vendor(object()), source=library)
    assert second == first
    assert [(s.st_ino, s.st_mtime_ns) for s in (os.lstat(p) for p in paths)] == before


def test_a_new_build_gets_its_own_file_and_the_stable_name_switches_to_it(tmp_path: Path) -> None:
    hooks = IsolationLibraries(tmp_path / "hooks")
    old = hooks.install(vendor(object()), source=build_library(tmp_path / "v1", marker="v1"))
    assert old is not None
    with old.path.open("rb") as mapped:  # stands for a running container, which resolved the name at its start
        old_inode = os.fstat(mapped.fileno()).st_ino
        new = hooks.install(vendor(object()), source=build_library(tmp_path / "v2", marker="v2"))
        assert new is not None
        assert new.build_path != old.build_path
        assert new.path == old.path
        assert os.readlink(new.path) == new.build_path.name
        assert b"v2" in new.path.read_bytes()
        assert os.fstat(mapped.fileno()).st_ino == old_inode == os.stat(old.build_path).st_ino
        assert b"v1" in mapped.read()  # the old build is untouched
    assert new.preload_path.read_text() == old.preload_path.read_text()  # same stable name: no change
    assert not list((tmp_path / "hooks" / "scripted").glob(".*"))  # no temporary file left behind


def test_an_old_in_place_library_is_replaced_by_rename_not_rewritten(tmp_path: Path) -> None:
    folder = tmp_path / "hooks" / "scripted"
    folder.mkdir(parents=True)
    (folder / "libscripted.so").write_bytes(b"HAMi's copy, mapped by running containers")
    mapped_inode = os.stat(folder / "libscripted.so").st_ino
    with (folder / "libscripted.so").open("rb") as mapped:
        installed = IsolationLibraries(tmp_path / "hooks").install(
            vendor(object()), source=build_library(tmp_path / "build")
        )
        assert installed is not None
        assert installed.path.is_symlink()
        assert os.fstat(mapped.fileno()).st_ino == mapped_inode
        assert mapped.read() == b"HAMi's copy, mapped by running containers"


def test_the_preload_file_is_switched_by_rename_so_a_mounted_one_keeps_its_content(tmp_path: Path) -> None:
    hooks = IsolationLibraries(tmp_path / "hooks")
    first = hooks.install(vendor(object(), library="libscripted.so"), source=build_library(tmp_path / "a"))
    assert first is not None
    folder = tmp_path / "hooks" / "scripted"
    with first.preload_path.open() as mounted:  # stands for a container's bind mount of the old file
        renamed = build_library(tmp_path / "b", name="libscripted-ng.so")
        second = hooks.install(vendor(object(), library="libscripted-ng.so"), source=renamed)
        assert second is not None
        assert second.preload_path.read_text() == f"{folder}/libscripted-ng.so\n"
        assert os.fstat(mounted.fileno()).st_ino != os.stat(second.preload_path).st_ino
        assert mounted.read() == f"{folder}/libscripted.so\n"


def test_a_vendor_without_a_shipped_library_installs_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    hooks = IsolationLibraries(tmp_path / "hooks")
    assert hooks.install(vendor(object(), library=None)) is None
    assert hooks.install(vendor(importlib.import_module("scripted_vendor"))) is None
    assert "names isolation library libscripted.so but its package hami-vendor-scripted ships no such file" in (
        caplog.text
    )
    assert hooks.installed == {}
