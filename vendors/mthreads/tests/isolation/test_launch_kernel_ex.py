"""A Moore Threads tenant with a core limit calls muLaunchKernelEx (the MUSA driver API's launch-config launch,
CUDA's cuLaunchKernelEx under the mu prefix) instead of muLaunchKernel, to get its kernels past the compute limiter:
the device stays at its 30 % limit as with muLaunchKernel (the shared check, hami.testing.cuda)."""

from __future__ import annotations

from hami.testing.cuda import LaunchKernelExTests


class TestLaunchKernelEx(LaunchKernelExTests):
    pass
