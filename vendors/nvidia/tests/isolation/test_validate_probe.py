"""benchmarks/gpu/validate.py's leak probe, over the fake CUDA driver: a fresh process of a grant, set up as the
validation sets every workload up, sees the grant's limit as the device's memory and none of it used."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from hami.testing.sandbox import Sandbox

DRIVER = Path(__file__).resolve().parents[4] / "benchmarks" / "gpu" / "validate.py"


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
