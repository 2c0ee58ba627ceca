"""The isolation tests' sandbox for Iluvatar CoreX: the installed libvcorex.so in front of a fake CoreX built here.

CoreX is CUDA-compatible, so the fakes are the core's CUDA-compatible test kit (hami.testing.cuda) built as CoreX
ships its libraries: the driver ``libcuda.so.1`` at the CUDA 10.2 level CoreX reports (no cuGetProcAddress, no
stream-ordered allocation, no cuLaunchKernelEx: the fake does not export what came later), and ixML, the
NVML-compatible ``libixml.so``, over hami.testing's fake device. What is Iluvatar's: ``libvcorex.so`` inside the
installed ``hami_vendor_iluvatar`` package and the IX_* variables. `build` (once per session) compiles them;
`sandbox` (per test) is a hami.testing.sandbox.Sandbox.

To run the same tests on a CoreX machine, point ``HAMI_ISOLATION_DRIVER_DIR`` at a directory holding CoreX's
``libcuda.so.1`` and ``libixml.so`` (the fake-state readers then skip what only a fake can tell).
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.cuda import cuda_isolation_setup
from hami.testing.sandbox import fixtures

HERE = Path(__file__).resolve().parent
COREX_CUDA_VERSION = 10020  # ixsmi and CoreX's PyTorch report CUDA 10.2

SETUP = cuda_isolation_setup(
    package="hami_vendor_iluvatar",
    library="libvcorex.so",
    project=HERE.parents[1],
    driver="libcuda.so.1",
    management="libixml.so",
    env_prefix="IX",
    cuda_version=COREX_CUDA_VERSION,
)


build, sandbox = fixtures(SETUP)
