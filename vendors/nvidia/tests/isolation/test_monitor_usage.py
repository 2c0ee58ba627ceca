"""The node monitor reads what libvgpu.so accounts: a served container's memory in use, its limit, its device time
(the shared check, hami.testing.isolation.MonitorTests)."""

from __future__ import annotations

from hami.testing.isolation import MonitorTests


class TestMonitor(MonitorTests):
    kind = "NVIDIA"
    uuid_variable = "NVIDIA_VISIBLE_DEVICES"
    kernel_ns_variable = "FAKE_CUDA_KERNEL_NS"
