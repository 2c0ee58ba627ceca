"""A Moore Threads tenant with a core limit calls musaLaunchKernelExC (the MUSA runtime's launch-config launch, CUDA's
cudaLaunchKernelExC by the mirror parity) instead of musaLaunchKernel, to get its kernels past the compute limiter:
libvmusa.so exports the hook, a program linked against libmusart.so is throttled through it to the same 30% as
through musaLaunchKernel, each launch admitted once, and a NULL config is the runtime's to refuse.

The checks of hami.testing.rt.LaunchConfigTests, for this harness: it is the CUDA-compatible layer's
(hami.testing.cuda), whose client speaks the driver API, so the tenant is ``musa_launch`` (``musa_launch.c``), a
program of the runtime API. A program, not a ctypes script: ctypes finds functions through dlsym, which libvmusa.so
answers with its hooks whether it exports them or not, while a linked program binds the name in the global scope,
where a hook the export list leaves out is not, and its launches go straight to the runtime."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import pytest

from hami.testing.isolation import SHARE_MEASUREMENT, device_shares, finish
from hami.testing.sandbox import Build, Sandbox

ENTRY = "musaLaunchKernelExC"
MUSA_LAUNCH = "musa_launch"  # the tenant program conftest builds
MODES = {"musaLaunchKernel": "kernel", ENTRY: "exc"}  # musa_launch's modes
INVALID_CONFIGURATION = 9  # musaErrorInvalidConfiguration, CUDA's value: the fake runtime's answer to a NULL config


@contextmanager
def tenant(sandbox: Sandbox, entry: str, seconds: float, env: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """musa_launch launching 32-block kernels through `entry` for `seconds` in `env`; killed if still running."""
    argv = [str(sandbox.build.built(MUSA_LAUNCH)), str(seconds), MODES[entry], "32"]
    proc = subprocess.Popen(argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_the_installed_library_exports_musa_launch_kernel_exc(build: Build) -> None:
    assert ENTRY in build.exported(), (
        f"{build.library} does not export {ENTRY}: a tenant's launches through it bypass the compute limiter "
        "(list it in vendors/mthreads/isolation/libvmusa.map)"
    )


@SHARE_MEASUREMENT
@pytest.mark.parametrize("entry", sorted(MODES))
def test_a_tenant_launching_through_musa_launch_kernel_exc_is_throttled_as_through_musa_launch_kernel(
    sandbox: Sandbox, entry: str
) -> None:
    env = sandbox.env(cores=30, extra={"FAKE_CUDA_KERNEL_NS": "1000000"})  # 1 ms kernels
    with tenant(sandbox, entry, 2.2, env) as proc:
        (share,) = device_shares(sandbox, [0], warmup=0.6, window=1.2)
        launched = finish(proc)["launches"]
    assert share == pytest.approx(0.30, abs=0.05), f"{entry}: the device was {share:.1%} busy under a 30% limit"
    device = sandbox.account().device(0)
    assert device.core_limit == 30
    # every launch admitted by the limiter once; it adds to the shared count in batches of 64 per thread
    assert launched - 64 < device.launches <= launched, f"{launched} launches through {entry}, {device.launches} seen"


NULL_CONFIG = rf"""
musa = load_musa()
assert musa.musaSetDevice(0) == 0
RESULT["answer"] = musa.{ENTRY}(None, c_void_p(0x1000), None)
"""


def test_a_null_config_reaches_the_runtime(sandbox: Sandbox) -> None:
    """The hook reads nothing through a NULL config: the runtime answers (the fake: invalid configuration, a code the
    library never gives itself), under a core limit too, and the process lives on."""
    result = sandbox.python(NULL_CONFIG, env=sandbox.env(cores=30))
    if sandbox.build.real_driver:
        assert result["answer"] != 0
    else:
        assert result["answer"] == INVALID_CONFIGURATION
