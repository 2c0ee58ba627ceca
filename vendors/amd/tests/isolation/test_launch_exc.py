"""A AMD tenant with a core limit calls hipLaunchKernelExC (HIP's launch-config launch) instead of hipLaunchKernel,
to get its kernels past the compute limiter: libamvgpu.so exports the hook, the launches are throttled to the same 30%
as hipLaunchKernel's, and a NULL config is the runtime's to refuse (hami.testing.rt.LaunchConfigTests)."""

from __future__ import annotations

from hami.testing.rt import LaunchConfigTests


class TestLaunchKernelExC(LaunchConfigTests):
    fake_prefix = "FAKE_AMD_"
