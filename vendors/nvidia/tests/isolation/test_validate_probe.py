"""benchmarks/gpu/validate.py's leak probe, over the fake CUDA driver: a fresh process of a grant, set up as the
validation sets every workload up, sees the grant's limit as the device's memory and none of it used."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hami.testing.sandbox import Sandbox

DRIVER = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu" / "validate.py"
# validate.py is the repository's, not the package's: the main suite always has it; a vendor tested from its wheel
# alone (tests/independence.py copies the vendor's tests, not the repository) has nothing here to test.
pytestmark = pytest.mark.skipif(not DRIVER.is_file(), reason="no repository checkout: benchmarks/gpu/validate.py")


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_driver", DRIVER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _probe(sandbox: Sandbox, env: dict[str, str]) -> dict[str, object]:
    out = sandbox.root / "probe.json"
    done = subprocess.run(
        [sys.executable, str(DRIVER), "--workload", "probe", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(out.read_text())
    return report


def test_the_probe_sees_the_grants_limit_free_under_the_library(sandbox: Sandbox) -> None:
    validate = _driver()
    env = sandbox.env(preload=False)
    env.update(validate.grant_environment(sandbox.build.library, sandbox.root, "w", "GPU-fake", 1024, 100))
    report = _probe(sandbox, env)
    assert report["status"] == "passed", report
    assert report["figures"] == {"total_mib": 1024, "free_mib": 1024, "used_mib": 0}


def test_without_the_library_the_probe_sees_the_whole_fake_device(sandbox: Sandbox) -> None:
    report = _probe(sandbox, sandbox.env(preload=False))
    assert report["status"] == "passed", report
    assert report["figures"]["total_mib"] > 1024  # type: ignore[index]


def test_a_whole_run_over_the_fake_driver_holds_the_driver_api_to_the_grant_and_skips_missing_frameworks(
    sandbox: Sandbox,
) -> None:
    """validate.py end to end on the CPU: a fake nvidia-smi reports a 16 GiB card, the fake CUDA driver is that card.
    The framework-free workload allocates to the limit and gets CUDA_ERROR_OUT_OF_MEMORY, the probe after it sees
    nothing leaked; every framework this environment lacks is skipped; the last line is the JSON report."""
    tools = sandbox.root / "bin"
    tools.mkdir()
    smi = tools / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Fake H100, GPU-fake, 16384, 16000, 384, 550.54.15'\n")
    smi.chmod(0o755)
    env = sandbox.env(preload=False, extra={"FAKE_CUDA_MEMORY": "16g", "FAKE_CUDA_NO_BACKING": "1"})
    env["PATH"] = f"{tools}:/usr/local/bin:/usr/bin:/bin"
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        env["PYTHONNOUSERSITE"] = "1"
    done = subprocess.run([sys.executable, str(DRIVER), "--limit-mib", "1024", "--budget-seconds", "120"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    report = json.loads(done.stdout.strip().splitlines()[-1])
    driver = report["results"]["driver_api"]
    assert driver["status"] == "passed", (driver, done.stderr[-2000:])
    assert driver["figures"]["allocated_mib"] == 1024
    assert driver["figures"]["oom_error"].endswith("CudaError")
    assert driver["after_exit"]["probe"] == {"total_mib": 1024, "free_mib": 1024, "used_mib": 0}
    assert report["limit_mib"] == 1024
    assert report["gpu"]["uuid"] == "GPU-fake"
    statuses = {name: r["status"] for name, r in report["results"].items()}
    assert set(statuses.values()) <= {"passed", "skipped"}, statuses
    assert report["ok"] is True
    assert done.returncode == 0
