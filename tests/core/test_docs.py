"""The plugin guide documents every hook of the contract and every conformance check, and its code works.

The walk-through's files (code blocks whose first line is ``# file: <path>``) are written into a temporary
folder; the fast tests import the plugin from there and load it strictly, the slow one runs the walk-through's
own commands (the block ``# run: walk-through``) in that folder: a fresh venv, hami-core installed editable from
this checkout and the plugin from the folder (uv, offline from its cache), the plugin's tests, and
``hami vendors --json``. Every other Python block must compile, every TOML and JSON block parse.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hami import hookspecs
from hami.plugins import VendorPlugins
from hami.testing.conformance import CHECKS

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "plugin-guide.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", flags=re.M | re.S)
_FILE = re.compile(r"# file: (\S+)\n")
RUN_MARK = "# run: walk-through\n"
WHEELS_MARK = "# run: wheels\n"
WALK_THROUGH_DIST = "hami-vendor-tinyaccel"
HOOKS = sorted(n for n in dir(hookspecs) if n.startswith("hami_") and callable(getattr(hookspecs, n)))


def _sections() -> dict[str, str]:
    text = GUIDE.read_text()
    heads = list(re.finditer(r"^### `(hami_\w+)\((.*?)\)", text, flags=re.M))
    return {m.group(1): m.group(2) for m in heads}


def test_the_contract_has_hooks_to_document() -> None:
    assert len(HOOKS) >= 9


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_guide_section_with_its_parameters(hook: str) -> None:
    sections = _sections()
    assert hook in sections, f"docs/plugin-guide.md has no '### `{hook}(...)`' section"
    documented = [p.strip() for p in sections[hook].split(",") if p.strip()]
    spec = list(inspect.signature(getattr(hookspecs, hook)).parameters)
    assert documented == spec, f"the guide's signature of {hook} lists {documented}, the specification {spec}"


def test_every_hook_specification_has_a_docstring_for_authors() -> None:
    for hook in HOOKS:
        doc = inspect.getdoc(getattr(hookspecs, hook)) or ""
        assert len(doc) > 80, f"{hook} needs a docstring for plugin authors"


def test_guide_names_every_conformance_check() -> None:
    text = GUIDE.read_text()
    missing = [c.name for c in CHECKS if f"`{c.name}`" not in text]
    assert not missing, f"docs/plugin-guide.md does not mention the checks {missing}"


def test_guide_documents_no_hook_that_does_not_exist() -> None:
    assert set(_sections()) <= set(HOOKS)


# --------------------------------------------------------------------------------------------------------
# The guide's code
# --------------------------------------------------------------------------------------------------------


def _blocks() -> list[tuple[str, str, int]]:
    """Every fenced block of the guide: language, text, line number of its fence."""
    text = GUIDE.read_text()
    return [(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in _FENCE.finditer(text)]


def _walk_through_files() -> dict[str, str]:
    files: dict[str, str] = {}
    for _, body, line in _blocks():
        mark = _FILE.match(body)
        if mark:
            assert mark.group(1) not in files, f"plugin-guide.md:{line}: {mark.group(1)} is written twice"
            files[mark.group(1)] = body
    return files


def _write_walk_through(into: Path) -> Path:
    for name, body in _walk_through_files().items():
        path = into / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    return into / WALK_THROUGH_DIST


def test_the_walk_through_is_a_complete_distribution() -> None:
    files = _walk_through_files()
    project = tomllib.loads(files[f"{WALK_THROUGH_DIST}/pyproject.toml"])
    assert project["build-system"]["build-backend"] == "hatchling.build"
    assert project["project"]["name"] == WALK_THROUGH_DIST
    assert "hami-core>=0.1,<0.2" in project["project"]["dependencies"]
    ((name, module),) = project["project"]["entry-points"]["hami.vendors"].items()
    assert name == "tinyaccel"
    assert f"{WALK_THROUGH_DIST}/src/{module.replace('.', '/')}.py" in files
    assert any(n.startswith(f"{WALK_THROUGH_DIST}/tests/test_") for n in files)
    tests = "".join(body for n, body in files.items() if "/tests/" in n)
    assert "hami_vendor_tinyaccel" in tests
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", tests, flags=re.M))
    assert not {m for m in imported if m.startswith("hami.") and not m.startswith(("hami.model", "hami.testing"))} - {
        "hami.plugins"
    }, "the walk-through's tests use only hami.model, hami.testing and hami.plugins"


def test_the_walk_through_plugin_loads_strictly_with_every_hook_it_describes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = _write_walk_through(tmp_path)
    monkeypatch.syspath_prepend(str(project / "src"))
    plugin = importlib.import_module("hami_vendor_tinyaccel.plugin")
    try:
        plugins = VendorPlugins.from_plugins({"tinyaccel": plugin}, config={"tinyaccel": {}}, strict=True)
        hooks = set(plugins.vendor("tinyaccel").hooks)
    finally:
        for module in [m for m in sys.modules if m.startswith("hami_vendor_tinyaccel")]:
            del sys.modules[module]
    named = ("vendor_info", "vendor_settings", "discover_devices", "container_request", "fit_nodes", "container_edits")
    assert hooks == {f"hami_{hook}" for hook in named}
    walk = GUIDE.read_text().split("## Walk-through", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{hook}`" in walk for hook in hooks), "the walk-through names every hook its plugin implements"


@pytest.mark.parametrize(
    ("language", "body", "line"), _blocks(), ids=[f"line{n}-{lang or 'text'}" for lang, _, n in _blocks()]
)
def test_every_code_block_is_valid(language: str, body: str, line: int) -> None:
    where = f"docs/plugin-guide.md:{line}"
    if language == "python":
        compile(body, where, "exec")
    elif language == "toml":
        tomllib.loads(body)
    elif language == "json":
        json.loads(body)


def _uv() -> str:
    for candidate in (Path(sys.executable).parent / "uv", shutil.which("uv")):
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    raise AssertionError("uv is needed to run the walk-through (it is in the dev environment)")


def _script(mark: str) -> list[str]:
    return [body for language, body, _ in _blocks() if language == "sh" and body.startswith(mark)]


@pytest.mark.slow
def test_the_walk_through_commands_install_test_and_list_the_plugin(tmp_path: Path) -> None:
    (script,) = _script(RUN_MARK)
    (wheels,) = _script(WHEELS_MARK)
    work = tmp_path / "work"
    _write_walk_through(work)
    # A PATH with uv and this interpreter's base Python ahead of the system's, and nothing of the dev venv (its
    # hami and pytest would hide a walk-through that installs nothing).
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "uv").symlink_to(_uv())
    (tools / "python3").symlink_to(getattr(sys, "_base_executable", sys.executable))
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "UV_PYTHON"}}
    env = {k: v for k, v in env.items() if not k.startswith(("HAMI_", "PYTEST_"))}
    env.update(
        HAMI=str(ROOT),
        UV_OFFLINE="1",  # everything comes from uv's cache: the walk-through needs no index in CI
        PATH=f"{tools}{os.pathsep}{env.get('PATH', '')}",
    )

    def run(script: str) -> list[str]:
        proc = subprocess.run(
            ["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout.strip().splitlines()

    lines = run(script)
    report = json.loads(lines[-1])
    summary = next(line for line in reversed(lines) if " passed" in line)
    assert re.search(rf"\b{len(CHECKS) + 2} passed\b", summary), summary
    assert not re.search(r"failed|skipped|error", summary), summary
    assert report["failed"] == []
    ((vendor),) = report["vendors"]
    assert (vendor["name"], vendor["distribution"], vendor["version"]) == ("tinyaccel", WALK_THROUGH_DIST, "0.1.0")
    assert "hami_container_edits" in vendor["hooks"]
    assert [k["common_word"] for k in vendor["kinds"]] == ["TinyAccel"]
    assert (work / ".venv" / "bin" / "hami").exists(), "hami came from the walk-through's own venv"

    # the wheels, installed into an environment of their own, give the same vendor
    from_wheels = json.loads(run(wheels)[-1])
    assert from_wheels["failed"] == []
    assert [(v["name"], v["distribution"]) for v in from_wheels["vendors"]] == [("tinyaccel", WALK_THROUGH_DIST)]


def test_the_walk_through_files_pass_ruff_as_this_repository_configures_it(tmp_path: Path) -> None:
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is in the dev environment"
    project = _write_walk_through(tmp_path)
    config = ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check", *config, "."], ["format", "--check", *config, "."]):
        proc = subprocess.run([str(ruff), *command], cwd=project, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # the guide's other Python blocks are formatted as the code they quote
    proc = subprocess.run(
        [str(ruff), "format", "--check", *config, str(GUIDE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
