"""Prove that each vendor package stands alone: its wheel, hami-core's wheel and nothing else pass its tests.

    python tests/independence.py nvidia ascend ...      (`make independence` runs it for every vendor)

For each vendor named: build the wheel of ``vendors/<name>/`` (hami-core's wheel is built once), create a
fresh virtual environment with ``uv venv``, install only those two wheels plus the test tools (pytest, hypothesis,
pytest-rerunfailures), then

1. run ``hami vendors --json`` there: it must list exactly this one vendor, from this distribution, with the
   device kinds (resource names, annotation keys) that the vendor's source declares, and nothing failed;
2. check that ``hami`` and the vendor import from the environment, not from this source tree;
3. run the vendor's tests from a copy of its folder without ``src/`` (so only the installed wheel can be
   imported), with ``--import-mode=importlib`` and a pytest configuration made from the root pyproject's
   markers and options, minus its test paths.

Prints one line per vendor (name, ok/FAILED, seconds) with the reasons under a failure, then one JSON
line; exits 1 when any vendor failed. Vendors run one after another and share one uv cache (uv's default,
or ``UV_CACHE_DIR``), so after the first run installing is a matter of links. Not collected by pytest
(the file name does not start with ``test_``); `tests/test_third_party_wheel.py` uses its helpers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "core"
VENDORS = ROOT / "vendors"
ENTRY_POINT_GROUP = "hami.vendors"
TEST_REQUIREMENTS = ("pytest", "hypothesis", "pytest-rerunfailures")
_NEVER_COPIED = {"__pycache__", ".pytest_cache", ".hypothesis", ".mypy_cache", ".ruff_cache"}
_TOP_NOT_COPIED = {"src", "build", "dist"}


class StepFailed(Exception):
    """A command of the procedure failed; the message has the command and the end of its output."""


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _show(argv: Sequence[str]) -> str:
    return " ".join("<script>" if "\n" in a else a for a in argv)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for commands run inside a fresh venv: nothing that points back at this checkout."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    env = {k: v for k, v in env.items() if not k.startswith("HAMI_")}
    env.update(extra)
    return env


def run(cmd: Sequence[str | Path], *, cwd: Path, timeout: float = 600, env: Mapping[str, str] | None = None) -> str:
    """Run a command; return its stdout, or raise StepFailed with its output when it fails."""
    argv = [str(c) for c in cmd]
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else clean_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise StepFailed(f"{_show(argv)}: no answer after {timeout:.0f} s") from None
    except OSError as exc:
        raise StepFailed(f"{_show(argv)}: {exc}") from None
    if proc.returncode != 0:
        raise StepFailed(f"{_show(argv)} exited {proc.returncode}:\n{_tail(proc.stdout + proc.stderr)}")
    return proc.stdout


def find_uv() -> str:
    """uv next to this interpreter (the dev venv has it), else on PATH."""
    for candidate in (Path(sys.executable).parent / "uv", Path(sys.prefix) / "bin" / "uv"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("uv")
    if found:
        return found
    raise SystemExit("uv is needed: install it into this environment (pip install uv) or put it on PATH")


def _has_hatchling() -> bool:
    try:
        import hatchling  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Uv:
    """The few uv commands the procedure needs, all sharing one cache."""

    exe: str = field(default_factory=find_uv)
    workdir: Path = field(default_factory=Path.cwd)

    def __call__(self, *args: str | Path, timeout: float = 600) -> str:
        return run([self.exe, *args], cwd=self.workdir, timeout=timeout)

    def build_wheel(self, project: Path, out_dir: Path) -> Path:
        """Build `project`'s wheel into `out_dir` (which must hold no other wheel) and return its path.

        Without build isolation when this interpreter has hatchling (fast, offline); isolated otherwise, or
        when the project needs build requirements this interpreter lacks.
        """
        out_dir.mkdir(parents=True, exist_ok=True)
        base: list[str | Path] = ["build", "--wheel", "--out-dir", out_dir, project]
        if _has_hatchling():
            try:
                self(*base, "--no-build-isolation", "--python", sys.executable)
            except StepFailed:
                self(*base)
        else:
            self(*base)
        wheels = sorted(out_dir.glob("*.whl"))
        if len(wheels) != 1:
            raise StepFailed(f"building {project} left {len(wheels)} wheels in {out_dir}: {[w.name for w in wheels]}")
        return wheels[0]

    def venv(self, path: Path) -> Path:
        """A fresh virtual environment at `path` on this interpreter's Python; returns its python."""
        self("venv", "--quiet", "--python", sys.executable, path)
        return path / "bin" / "python"

    def install(self, python: Path, *requirements: str | Path) -> None:
        """Install into the venv of `python`: from the uv cache alone when it can, from the index otherwise."""
        try:
            self("pip", "install", "--quiet", "--offline", "--python", python, *requirements)
        except StepFailed:
            self("pip", "install", "--quiet", "--python", python, *requirements, timeout=1200)


def hami_vendors(venv_python: Path, cwd: Path) -> tuple[int, dict[str, Any], str]:
    """Run ``hami vendors --json`` of the venv: exit status, parsed report, stderr."""
    hami = venv_python.parent / "hami"
    proc = subprocess.run(
        [str(hami), "vendors", "--json"], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120
    )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        raise StepFailed(
            f"{hami} vendors --json exited {proc.returncode} without a JSON report:\n{_tail(proc.stdout + proc.stderr)}"
        ) from None
    return proc.returncode, report, proc.stderr


# --------------------------------------------------------------------------------------------------------
# One vendor
# --------------------------------------------------------------------------------------------------------

_SOURCE_METADATA = """
import importlib, json, sys
sys.path[:0] = sys.argv[1:3]
out = {}
for name, module in json.loads(sys.argv[3]).items():
    info = importlib.import_module(module).hami_vendor_info()
    out[name] = [kind.model_dump(mode="json") for kind in info.kinds]
print(json.dumps(out))
"""


@dataclass
class Declared:
    """What a vendor's own source says it is: distribution, entry points and their device kinds."""

    distribution: str
    entry_points: dict[str, str]
    kinds: dict[str, list[dict[str, Any]]]


def declared(vendor_dir: Path, cwd: Path) -> Declared:
    """Read the vendor's pyproject, and its kinds from `hami_vendor_info` of its source tree (not the wheel)."""
    project = tomllib.loads((vendor_dir / "pyproject.toml").read_text())["project"]
    entry_points = dict(project.get("entry-points", {}).get(ENTRY_POINT_GROUP, {}))
    if not entry_points:
        raise StepFailed(f"{vendor_dir}/pyproject.toml declares no entry point in group {ENTRY_POINT_GROUP}")
    modules = {name: value.split(":")[0] for name, value in entry_points.items()}
    out = run(
        [sys.executable, "-c", _SOURCE_METADATA, CORE / "src", vendor_dir / "src", json.dumps(modules)],
        cwd=cwd,
        timeout=120,
    )
    return Declared(project["name"], entry_points, json.loads(out))


def check_report(code: int, report: Mapping[str, Any], expect: Declared) -> list[str]:
    """What is wrong with a `hami vendors --json` answer, given what the vendor declares."""
    problems = []
    if report.get("failed"):
        problems.append(f"plugins failed to load: {report['failed']}")
    if report.get("disabled"):
        problems.append(f"plugins disabled: {report['disabled']}")
    if code != 0:
        problems.append(f"hami vendors exited {code}")
    listed = {v["name"]: v for v in report.get("vendors", [])}
    if sorted(listed) != sorted(expect.entry_points):
        problems.append(f"lists vendors {sorted(listed)}, expected exactly {sorted(expect.entry_points)}")
    for name, vendor in listed.items():
        if name not in expect.kinds:
            continue
        if vendor["distribution"] != expect.distribution:
            problems.append(f"{name} comes from {vendor['distribution']!r}, expected {expect.distribution!r}")
        got = [(k["common_word"], k["resources"]) for k in vendor["kinds"]]
        want = [(k["common_word"], k["resources"]) for k in expect.kinds[name]]
        if got != want:
            problems.append(f"{name} lists kinds and resources {got}, its source declares {want}")
        elif vendor["kinds"] != expect.kinds[name]:
            problems.append(
                f"{name}'s installed kinds differ from its source: {vendor['kinds']} != {expect.kinds[name]}"
            )
    return problems


_WHERE = """
import importlib, json, sys
print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))
"""


def check_imports_installed(python: Path, modules: Sequence[str], cwd: Path) -> list[str]:
    """Problems when a module imports from anywhere but the venv's site-packages."""
    venv = python.parent.parent.resolve()
    where = json.loads(run([python, "-c", _WHERE, *modules], cwd=cwd, timeout=120))
    return [
        f"{module} imports from {path}, not from the fresh environment"
        for module, path in where.items()
        if venv not in Path(path).resolve().parents
    ]


def pytest_config(path: Path) -> Path:
    """A pytest.ini with the root pyproject's options (markers, warnings, importlib mode), without testpaths."""
    options = tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {}).get("pytest", {})
    options = dict(options.get("ini_options", {}))
    options.pop("testpaths", None)
    addopts = str(options.pop("addopts", ""))
    if "--import-mode=importlib" not in addopts:
        addopts += " --import-mode=importlib"
    lines = ["[pytest]", f"addopts = {addopts.strip()}"]
    for key, value in options.items():
        if isinstance(value, list):
            lines.append(f"{key} =")
            lines.extend(f"    {item}" for item in value)
        else:
            lines.append(f"{key} = {value}")
    path.write_text("\n".join(lines) + "\n")
    return path


def copy_without_source(package: Path, dest: Path) -> Path:
    """Copy a package folder without its `src/` (and build output), so its tests can import only what is installed."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n in _NEVER_COPIED or n.endswith(".egg-info")}
        if Path(directory) == package:
            skip |= _TOP_NOT_COPIED.intersection(names)
        return skip

    shutil.copytree(package, dest, ignore=ignore)
    return dest


@dataclass
class VendorResult:
    name: str
    ok: bool = False
    seconds: float = 0.0
    tests: str = ""
    problems: list[str] = field(default_factory=list)


def check_vendor(name: str, core_wheel: Path, uv: Uv, work: Path) -> VendorResult:
    result = VendorResult(name)
    started = time.monotonic()
    try:
        result.problems = _check_vendor(name, core_wheel, uv, work / name, result)
    except StepFailed as exc:
        result.problems.append(str(exc))
    result.ok = not result.problems
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _check_vendor(name: str, core_wheel: Path, uv: Uv, work: Path, result: VendorResult) -> list[str]:
    vendor_dir = VENDORS / name
    if not (vendor_dir / "pyproject.toml").is_file():
        return [f"{vendor_dir} is not a vendor package (no pyproject.toml)"]
    work.mkdir(parents=True)
    expect = declared(vendor_dir, work)
    wheel = uv.build_wheel(vendor_dir, work / "wheel")
    python = uv.venv(work / "venv")
    uv.install(python, core_wheel, wheel, *TEST_REQUIREMENTS)

    code, report, _ = hami_vendors(python, work)
    problems = check_report(code, report, expect)
    modules = ["hami", *sorted({value.split(":")[0] for value in expect.entry_points.values()})]
    problems += check_imports_installed(python, modules, work)

    copy = copy_without_source(vendor_dir, work / "project")
    target = copy / "tests" if (copy / "tests").is_dir() else copy
    config = pytest_config(work / "pytest.ini")
    argv = [python, "-m", "pytest", target, "-q", "-p", "no:cacheprovider", "-c", config, "--rootdir", copy]
    argv += ["--import-mode=importlib"]
    proc = subprocess.run(
        [str(a) for a in argv], cwd=work, env=clean_env(), capture_output=True, text=True, timeout=3600
    )
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    if proc.returncode == 5:  # pytest: no tests were collected; every vendor must test itself
        result.tests = "no tests"
        problems.append("it has no tests: every vendor package runs at least the conformance kit")
    elif proc.returncode == 0:
        result.tests = summary
    else:
        result.tests = summary
        problems.append(
            f"its tests failed against the installed wheels (pytest exit {proc.returncode}):\n"
            f"{_tail(proc.stdout + proc.stderr, 40)}"
        )
    return problems


# --------------------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("vendors", nargs="+", help="vendor folder names under vendors/, e.g. nvidia ascend")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory and print where it is")
    args = parser.parse_args(argv)

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="hami-independence-"))
    uv = Uv(workdir=work)
    results: list[VendorResult] = []
    try:
        try:
            core_wheel = uv.build_wheel(CORE, work / "core-wheel")
        except StepFailed as exc:
            print(f"hami-core's wheel did not build: {exc}", file=sys.stderr)
            results = [VendorResult(name, problems=["hami-core's wheel did not build"]) for name in args.vendors]
        else:
            for name in dict.fromkeys(args.vendors):
                result = check_vendor(name, core_wheel, uv, work)
                results.append(result)
                status = "ok" if result.ok else "FAILED"
                detail = f"  {result.tests}" if result.tests else ""
                print(f"{name:<12} {status:<7} {result.seconds:6.1f}s{detail}", flush=True)
                for problem in result.problems:
                    print("    " + problem.replace("\n", "\n      "), flush=True)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    ok = bool(results) and all(r.ok for r in results)
    print(
        json.dumps({"ok": ok, "seconds": round(time.monotonic() - started, 1), "vendors": [asdict(r) for r in results]})
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
