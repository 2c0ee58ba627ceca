"""benchmarks/gpu/validate.sh where no GPU is: it says so and exits 3 without a traceback; and the parts of it that
a CPU can check (the library it builds, the grant it writes, the variables it sets, a workload's report)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hami.isolation.grant import DeviceGrant, Grant, parse
from hami.model import ContainerDevice, Pod
from hami_vendor_nvidia.edits import container_edits
from hami_vendor_nvidia.settings import NvidiaSettings

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu" / "validate.sh"
DRIVER = REPO / "benchmarks" / "gpu" / "validate.py"


def _driver() -> ModuleType:
    spec = importlib.util.spec_from_file_location("validate_driver", DRIVER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _no_gpu_env(tmp_path: Path) -> dict[str, str]:
    """PATH with python and the shell tools but no nvidia-smi, and no libcuda.so.1 to be found."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path / "nothing")}


def test_without_a_gpu_it_says_so_and_exits_3_with_one_json_line_and_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        ["sh", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False, env=_no_gpu_env(tmp_path)
    )
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["gpu"] is False
    assert report["ok"] is False
    assert "libcuda.so.1" in report["reason"]
    assert "no NVIDIA GPU here" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize(("output", "code"), [("garbage, more\n", 0), ("", 9), ("No devices were found\n", 6)])
def test_an_nvidia_smi_that_finds_no_gpu_or_prints_garbage_is_no_gpu(tmp_path: Path, output: str, code: int) -> None:
    env = _no_gpu_env(tmp_path)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {code}\n")
    smi.chmod(0o755)
    done = subprocess.run(["sh", str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 3
    assert "nvidia-smi reports no GPU" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_grant_it_writes_is_the_one_the_node_daemon_writes() -> None:
    validate = _driver()
    text = validate.render_grant(3000, 30, "GPU-abc")
    assert text == Grant((DeviceGrant(3000 << 20, 30, "GPU-abc"),), policy="force").render()
    assert parse(text).devices[0].cores == 30


def test_its_variables_are_the_nvidia_plugins_container_edits_and_hami_runs(tmp_path: Path) -> None:
    validate = _driver()
    env = validate.grant_environment(Path("/lib/libvgpu.so"), tmp_path, "w", "GPU-abc", 3000, 30)
    pod = Pod(name="p", namespace="default", uid="6f1e2d3c-0000-4000-8000-000000000001")
    edits = container_edits(
        NvidiaSettings(), pod, 0, (ContainerDevice(uuid="GPU-abc", type="NVIDIA", usedmem=3000, usedcores=30),)
    )
    for key, value in edits.env.items():
        assert key in env, f"the NVIDIA plugin sets {key}, validate does not"
        if key != "CUDA_DEVICE_MEMORY_SHARED_CACHE":  # a path: the container's, or validate's scratch
            assert env[key] == value
    assert {"LD_PRELOAD", "HAMI_ISOLATION_GRANT_DIR", "CUDA_VISIBLE_DEVICES"} <= set(env)  # hami run's, for a host
    assert parse((Path(env["HAMI_ISOLATION_GRANT_DIR"]) / "nvidia.grant").read_text()).devices[0].memory_bytes == (
        3000 << 20
    )


def test_it_builds_libvgpu_from_the_checkout(tmp_path: Path) -> None:
    library = _driver().build_library(tmp_path)
    assert library.read_bytes()[:4] == b"\x7fELF"
    symbols = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=False
    ).stdout
    if symbols:
        assert " cuMemAlloc_v2" in symbols
        assert " cuGetProcAddress_v2" in symbols


def test_a_workload_whose_framework_is_missing_is_skipped_and_one_that_crashes_is_failed(tmp_path: Path) -> None:
    env = {**os.environ, "VALIDATE_LIMIT_MIB": "1024", "VALIDATE_CEILING_MIB": "2048", "PYTHONPATH": ""}
    out = tmp_path / "report.json"
    code = "import sys; sys.modules['torch'] = None; sys.argv[1:] = ['--workload', 'torch_caching', '--out', %r]; "
    code += "import runpy; runpy.run_path(%r, run_name='__main__')"
    subprocess.run([sys.executable, "-c", code % (str(out), str(DRIVER))], env=env, check=False, timeout=60)
    report = json.loads(out.read_text())
    assert report["status"] == "skipped"
    assert "torch is not installed" in report["error"]
    env["LD_LIBRARY_PATH"] = str(tmp_path / "nothing")
    subprocess.run(
        [sys.executable, str(DRIVER), "--workload", "probe", "--out", str(out)], env=env, check=False, timeout=60
    )
    report = json.loads(out.read_text())
    assert report["status"] == "failed"
    assert "libcuda.so.1" in report["error"]
