"""The node monitor reads what libamvgpu.so accounts in the soft mode: a served AMD GPU container's memory in use, its
limit and its device time (the shared check, hami.testing.isolation.MonitorTests)."""

from __future__ import annotations

from hami.testing.isolation import MonitorTests


class TestMonitor(MonitorTests):
    kind = "AMD"
    uuid_variable = "HIP_DEVICE_UUIDS"
    device_uuid = "GPU-0d74a1ff-0000-1000-8000-000000000000"
    kernel_ns_variable = "FAKE_AMD_KERNEL_NS"
