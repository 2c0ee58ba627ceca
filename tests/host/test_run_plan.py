"""How ``hami run`` turns a vendor's container edits into a host process's (hami.host.run.plan), over a made-up
vendor written here as a third party would write one: paths inside mounts become host paths under the state
directory, the vendor's host environment is added, the preload and the grant variable point at the run's files;
and what the vendor cannot give is refused, saying what is missing."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import pytest

from hami.errors import HamiError
from hami.host.run import parse_request, plan
from hami.isolation.grant import GRANT_DIR, from_limits, grant_edits
from hami.plugins import VendorPlugins

PLUGIN = """
from pathlib import PurePosixPath
from hami import hookimpl
from hami.isolation.grant import from_limits, grant_edits
from hami.model import (AnnotationKeys, ContainerEdits, DeviceKind, Device, Mount, NodeInventory, ResourceNames,
                        VendorInfo)

KIND = DeviceKind(common_word="FAKE", resources=ResourceNames(count="fake.io/dev", memory="fake.io/mem"),
                  annotations=AnnotationKeys(node_register="fake.io/register", to_allocate="fake.io/to-allocate",
                                             allocated="fake.io/allocated"))
GIVE = {"grant": True, "preload": True, "host_env": True}

@hookimpl
def hami_vendor_info():
    return VendorInfo(name="fakeaccel", display_name="Fake", kinds=(KIND,), isolation_library="libfake.so")

@hookimpl
def hami_discover_devices():
    return [NodeInventory(kind="FAKE", devices=(Device(id="FAKE-0", index=0, devmem=1024, type="FAKE"),
                                                Device(id="FAKE-1", index=3, devmem=1024, type="FAKE")))]

@hookimpl
def hami_container_edits(pod, devices, library):
    env = {"FAKE_MEMORY_LIMIT_0": f"{devices[0].usedmem}m", "FAKE_CACHE": "/inside/acct/fake.cache",
           "FAKE_TOOL": "/opt/fake/bin/tool", "FAKE_VISIBLE": devices[0].uuid}
    mounts = [Mount(container_path="/inside/acct", host_path=f"/node/acct/{pod.uid}", read_only=False),
              Mount(container_path="/opt/fake", host_path="/usr/lib/fake")]
    if GIVE["preload"]:
        mounts += [Mount(container_path=library.path, host_path=library.path),
                   Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path)]
    files = {}
    if GIVE["grant"]:
        grant_mount, files = grant_edits(PurePosixPath(f"/node/grants/{pod.uid}"), "fakeaccel",
                                         from_limits([(d.usedmem, d.usedcores, d.uuid) for d in devices]))
        mounts.append(grant_mount)
    accounting = f"/node/acct/{pod.uid}/fake.cache"
    return ContainerEdits(env=env, mounts=tuple(mounts), files=files, accounting_file=accounting)

@hookimpl
def hami_host_environment(devices, indices):
    return {"FAKE_HOST_VISIBLE": ",".join(map(str, indices))} if GIVE["host_env"] else None
"""


@pytest.fixture
def vendor(tmp_path: Path) -> Iterator[ModuleType]:
    package = tmp_path / "fakeaccel_plugin"
    package.mkdir()
    (package / "__init__.py").write_text(PLUGIN)
    (package / "libfake.so").write_bytes(b"\x7fELF not really")
    spec = importlib.util.spec_from_file_location("fakeaccel_plugin", package / "__init__.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fakeaccel_plugin"] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules["fakeaccel_plugin"]


def _plan(vendor: ModuleType, tmp_path: Path, flags: dict[str, Any] | None = None, confined: bool = False) -> Any:
    plugins = VendorPlugins.from_plugins({"fakeaccel": vendor})
    values = {"--vendor": "fakeaccel", "--device": "3", "--memory": "512", "COMMAND": ["app"], **(flags or {})}
    return plan(parse_request(values), plugins, tmp_path / "state", confined=confined, environ={"PATH": "/bin"})


def test_mount_paths_become_the_runs_host_paths(vendor: ModuleType, tmp_path: Path) -> None:
    launch = _plan(vendor, tmp_path, {"--share": "nb"})
    state = tmp_path / "state"
    assert launch.env["FAKE_CACHE"] == str(state / "accounting" / "nb" / "fake.cache")
    assert launch.accounting_file == state / "accounting" / "nb" / "fake.cache"
    assert launch.env["FAKE_TOOL"] == "/usr/lib/fake/bin/tool", "a read-only mount's path is its host path"
    assert launch.env["FAKE_HOST_VISIBLE"] == "3", "the vendor's host selector, by discovery index"
    assert launch.env["FAKE_MEMORY_LIMIT_0"] == "512m"
    assert launch.env["HAMI_ISOLATION_GRANT_DIR"] == str(state / "grants" / "nb")
    assert launch.env["LD_PRELOAD"] == str(state / "lib" / "fakeaccel" / "libfake.so")
    assert list(launch.files) == [
        str(state / "grants" / "nb" / "fakeaccel.grant"),
        str(state / "grants" / "nb" / "fakeaccel.control"),
    ]
    expected = grant_edits(PurePosixPath("/x"), "fakeaccel", from_limits([(512, 0, "FAKE-1")]))[1]["/x/fakeaccel.grant"]
    assert launch.files[str(state / "grants" / "nb" / "fakeaccel.grant")] == expected
    assert launch.moved[GRANT_DIR] == str(state / "grants" / "nb")


def test_a_confined_run_carries_neither_preload_nor_grant_variable(vendor: ModuleType, tmp_path: Path) -> None:
    launch = _plan(vendor, tmp_path, confined=True)
    assert "LD_PRELOAD" not in launch.env
    assert "HAMI_ISOLATION_GRANT_DIR" not in launch.env


@pytest.mark.parametrize(
    ("withheld", "message"),
    [
        ("grant", "hami run: vendor fakeaccel's container edits give this placement no grant"),
        ("preload", "give this placement no /etc/ld.so.preload"),
        ("host_env", "hami run: vendor fakeaccel does not say how a host process sees only the chosen devices"),
    ],
)
def test_what_the_vendor_does_not_give_is_refused_saying_so(
    vendor: ModuleType, tmp_path: Path, withheld: str, message: str
) -> None:
    vendor.GIVE[withheld] = False
    with pytest.raises(HamiError, match=message):
        _plan(vendor, tmp_path)


def test_more_memory_than_the_device_has_is_refused(vendor: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(HamiError, match=r"--memory: 2048 MiB is more than device 3 has \(1024 MiB\)"):
        _plan(vendor, tmp_path, {"--memory": "2Gi"})


def test_a_device_discovery_does_not_report_is_refused_with_those_it_found(vendor: ModuleType, tmp_path: Path) -> None:
    with pytest.raises(HamiError, match=r"no device 1 here; it found 0 \(FAKE FAKE-0\), 3 \(FAKE FAKE-1\)"):
        _plan(vendor, tmp_path, {"--device": "1"})
