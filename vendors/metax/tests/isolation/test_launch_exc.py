"""A MetaX tenant with a core limit calls mcLaunchKernelExC (MACA's launch-config launch, CUDA's cudaLaunchKernelExC
by parity) instead of mcLaunchKernel, to get its kernels past the compute limiter: libvmaca.so exports the hook, the
launches are throttled to the same 30% as mcLaunchKernel's, and a NULL config is the runtime's to refuse
(hami.testing.rt.LaunchConfigTests)."""

from __future__ import annotations

from hami.testing.rt import LaunchConfigTests


class TestLaunchKernelExC(LaunchConfigTests):
    fake_prefix = "FAKE_MX_"
