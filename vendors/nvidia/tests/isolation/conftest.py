"""The isolation tests' sandbox for NVIDIA: the installed libvgpu.so in front of fake drivers built here.

hami.testing.sandbox does the work, over the CUDA-compatible hook layer's test kit (hami.testing.cuda: the fake
CUDA driver ``libcuda.so.1`` and minimal fake NVML ``libnvidia-ml.so.1`` over hami.testing's fake device, the
client program, the ctypes prelude); this file says what is NVIDIA's: ``libvgpu.so`` inside the installed
``hami_vendor_nvidia`` package, HAMi-core's CUDA_* variables, and three tiny libraries for the RTLD_NEXT check.
`build` (once per session) compiles them; `sandbox` (per test) is a hami.testing.sandbox.Sandbox.

To run the same tests against a real GPU, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding the real
``libcuda.so.1``/``libnvidia-ml.so.1`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.cuda import CUDA_HOOKS, NVML_HOOKS, PRELUDE, cuda_isolation_setup
from hami.testing.isolation import DEEP_LOOKUP
from hami.testing.sandbox import CTarget, fixtures

HERE = Path(__file__).resolve().parent

__all__ = ["CUDA_HOOKS", "NVML_HOOKS", "PRELUDE", "SETUP", "build", "sandbox"]

SETUP = cuda_isolation_setup(
    package="hami_vendor_nvidia",
    library="libvgpu.so",
    project=HERE.parents[1],
    driver="libcuda.so.1",
    management="libnvidia-ml.so.1",
    env_prefix="CUDA",
    log_level_variable="LIBCUDA_LOG_LEVEL",
    helpers=(
        CTarget("libinterposed.so", (HERE / "interposed.c",), ("-fPIC", "-shared")),
        CTarget("libinterposer.so", (HERE / "interposer.c",), ("-fPIC", "-shared"), ("-ldl",)),
        CTarget("libdeep.so", (DEEP_LOOKUP,), ("-fPIC", "-shared"), ("-ldl",)),
    ),
)


build, sandbox = fixtures(SETUP)
