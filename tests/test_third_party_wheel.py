"""A third-party vendor works by `pip install` alone: the example plugin and hami-core, as wheels, in a fresh venv.

Builds the wheels of `core/` and `examples/third-party-vendor/`, installs only those two (and their
dependencies) into a new virtual environment, and runs that environment's `hami vendors --json` the way an
operator would. Then adds a deliberately broken plugin distribution and checks that it is reported by name
and cause while the example keeps working. Uses the helpers of `tests/independence.py`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "third-party-vendor"

BROKEN_ERROR = "libbroken.so.1: cannot open shared object file (the Broken SDK is not installed)"
BROKEN_PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "hami-vendor-broken"
version = "0.0.1"
requires-python = ">=3.11"
dependencies = ["hami-core"]

[project.entry-points."hami.vendors"]
broken = "hami_vendor_broken.plugin"

[tool.hatch.build.targets.wheel]
packages = ["src/hami_vendor_broken"]
"""


def _independence() -> ModuleType:
    name = "hami_tests_independence"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("independence.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class FreshVenv:
    helpers: Any  # tests/independence.py, loaded from its file
    uv: Any  # its Uv
    python: Path
    work: Path

    def hami_vendors(self) -> tuple[int, dict[str, Any], str]:
        result: tuple[int, dict[str, Any], str] = self.helpers.hami_vendors(self.python, self.work)
        return result

    def distributions(self) -> set[str]:
        listing = json.loads(self.uv("pip", "list", "--format", "json", "--python", self.python))
        return {entry["name"] for entry in listing}


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> FreshVenv:
    helpers = _independence()
    work = tmp_path_factory.mktemp("third-party-wheel")
    uv = helpers.Uv(workdir=work)
    core = uv.build_wheel(helpers.CORE, work / "core-wheel")
    example = uv.build_wheel(EXAMPLE, work / "example-wheel")
    python = uv.venv(work / "venv")
    uv.install(python, core, example)
    return FreshVenv(helpers, uv, python, work)


def test_installed_wheels_list_exactly_the_example_vendor(venv: FreshVenv) -> None:
    hami = {name for name in venv.distributions() if name.startswith("hami")}
    assert hami == {"hami-core", "hami-vendor-exampleaccel"}

    code, report, stderr = venv.hami_vendors()
    assert code == 0, stderr
    assert report["failed"] == []
    assert report["disabled"] == []
    vendors = report["vendors"]
    assert [(v["name"], v["distribution"], v["version"]) for v in vendors] == [
        ("exampleaccel", "hami-vendor-exampleaccel", "0.1.0")
    ]
    (kind,) = vendors[0]["kinds"]
    assert kind["common_word"] == "ExampleAccel"
    resources = {k: v for k, v in kind["resources"].items() if isinstance(v, str)}
    assert resources == {
        "count": "example.com/accel",
        "memory": "example.com/accel-memory",
        "cores": "example.com/accel-cores",
    }
    assert kind["annotations"]["node_register"] == "hami.io/node-exampleaccel-register"
    assert set(vendors[0]["hooks"]) >= {
        "hami_vendor_info",
        "hami_vendor_settings",
        "hami_discover_devices",
        "hami_container_request",
        "hami_fit_nodes",
        "hami_container_edits",
    }


def test_a_broken_plugin_is_reported_and_the_example_keeps_working(venv: FreshVenv, tmp_path: Path) -> None:
    project = tmp_path / "broken"
    package = project / "src" / "hami_vendor_broken"
    package.mkdir(parents=True)
    (project / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (package / "__init__.py").write_text(
        '"""A vendor plugin whose import fails, as one does when its SDK is missing."""\n'
    )
    (package / "plugin.py").write_text(f"raise ImportError({BROKEN_ERROR!r})\n")
    wheel = venv.uv.build_wheel(project, tmp_path / "wheel")
    venv.uv.install(venv.python, wheel)
    try:
        code, report, stderr = venv.hami_vendors()
    finally:
        venv.uv("pip", "uninstall", "--python", venv.python, "hami-vendor-broken")

    assert code == 1
    assert [v["name"] for v in report["vendors"]] == ["exampleaccel"]
    assert len(report["failed"]) == 1
    (broken,) = report["failed"]
    assert (broken["name"], broken["distribution"], broken["version"]) == ("broken", "hami-vendor-broken", "0.0.1")
    assert "ImportError" in broken["error"]
    assert BROKEN_ERROR in broken["error"]
    assert "hami-vendor-broken" in stderr  # the log names the distribution to fix
