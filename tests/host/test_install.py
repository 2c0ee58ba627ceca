"""``hami host install``: the installed vendors' libraries under versioned paths in a staging root, the preload and
CDI files naming the final paths, a second install changing nothing; ``hami run``'s request errors in
hami.validation's format, and no input making it fail otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hami.errors import HamiError
from hami.host import install
from hami.host.run import parse_request
from hami.plugins import VendorPlugins

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


def _hami(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hami.cli", *args], capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip


def test_install_puts_each_library_under_a_versioned_path_naming_the_final_paths(tmp_path: Path) -> None:
    done = _hami("host", "install", "--prefix", str(tmp_path), "--libdir", "/usr/lib/hami", "--write", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    by_vendor = {lib["vendor"]: lib for lib in report["libraries"]}
    assert set(LIBRARIES) <= set(by_vendor), "every vendor whose package ships a library"
    assert "exampleaccel" not in by_vendor, "a vendor without a library (the example plugin) gets nothing"
    for vendor, name in LIBRARIES.items():
        lib = by_vendor[vendor]
        assert lib["path"] == f"/usr/lib/hami/{vendor}/{name}"
        staged = tmp_path / lib["path"].lstrip("/")
        assert staged.is_symlink()
        assert os.readlink(staged) == Path(lib["build"]).name
        assert Path(lib["build"]).name.startswith(name.removesuffix(".so") + "-")
        assert (tmp_path / lib["preload"].lstrip("/")).read_text() == f"{lib['path']}\n"
        spec = json.loads((tmp_path / "etc" / "cdi" / f"hami-{vendor}.json").read_text())
        assert spec["kind"] == f"hami.io/{vendor}"
        mounts = spec["devices"][0]["containerEdits"]["mounts"]
        assert {(m["hostPath"], m["containerPath"]) for m in mounts} == {
            (lib["path"], lib["path"]),
            (lib["preload"], "/etc/ld.so.preload"),
        }


def test_a_second_install_rewrites_no_build(tmp_path: Path) -> None:
    plugins = VendorPlugins.load()
    first = install.install(plugins, tmp_path, ["nvidia"])
    build = tmp_path / first[0].build.lstrip("/")
    before = build.stat().st_mtime_ns, build.stat().st_ino
    second = install.install(plugins, tmp_path, ["nvidia"])
    assert second == first
    assert (build.stat().st_mtime_ns, build.stat().st_ino) == before


def test_install_of_a_vendor_without_a_library_says_so(tmp_path: Path) -> None:
    done = _hami("host", "install", "--prefix", str(tmp_path), "--vendor", "exampleaccel")
    assert done.returncode == 2
    assert "hami host install: vendor exampleaccel ships no isolation library" in done.stderr
    assert not (tmp_path / "usr").exists()


def test_install_of_a_misspelt_vendor_names_the_nearest_loaded_one(tmp_path: Path) -> None:
    with pytest.raises(HamiError, match=r"--vendor: no vendor plugin nvida is loaded; .*\(did you mean 'nvidia'\?\)"):
        install.install(VendorPlugins.load(), tmp_path, ["nvida"])
    assert not (tmp_path / "usr").exists()


def test_status_without_runs_says_so(tmp_path: Path) -> None:
    done = _hami("host", "status", "--state-dir", str(tmp_path))
    assert done.returncode == 0
    assert done.stdout.startswith("no grants")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"--memory": "3x"}, "hami run: --memory: '3x' is not a size: MiB (3000), or a quantity with a unit (3Gi)"),
        ({"--memory": "-1"}, "hami run: --memory: '-1' is not a size"),
        ({"--device": "0,a"}, "hami run: --device: '0,a' is not a device index"),
        ({"--device": "1,1"}, "hami run: --device: '1,1' names a device twice"),
        ({"--cores": "101"}, "hami run: --cores: Input should be less than or equal to 100"),
        ({"--share": "../x"}, "hami run: --share: '../x' is not a share name: 1-63 letters, digits"),
        ({"COMMAND": []}, "hami run: COMMAND: no command: give it after --"),
    ],
)
def test_a_malformed_request_names_the_flag_and_what_is_legal(flags: dict[str, object], message: str) -> None:
    values = {"--vendor": "nvidia", "--device": "0", "--memory": "3000", "COMMAND": ["true"], **flags}
    with pytest.raises(HamiError) as caught:
        parse_request(values)
    assert str(caught.value).startswith(message), caught.value


def test_a_size_with_a_unit_is_mib() -> None:
    request = parse_request({"--vendor": "nvidia", "--device": "0,2", "--memory": "3Gi", "COMMAND": ["true"]})
    assert (request.memory, request.devices) == (3072, (0, 2))


@settings(max_examples=300, deadline=None)
@given(device=st.text(max_size=12), memory=st.text(max_size=24), cores=st.text(max_size=6),
       share=st.text(max_size=70))  # fmt: skip
def test_any_input_is_a_request_or_a_clear_error(device: str, memory: str, cores: str, share: str) -> None:
    values = {"--vendor": "nvidia", "--device": device, "--memory": memory, "--cores": cores, "--share": share,
              "COMMAND": ["true"]}  # fmt: skip
    try:
        parse_request(values)
    except HamiError as exc:
        message = str(exc)
    else:
        return
    assert message.startswith("hami run: --"), message
