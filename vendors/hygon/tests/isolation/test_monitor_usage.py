"""The node monitor reads what libvdcu.so accounts in the soft mode: a served DCU container's memory in use, its
limit and its device time (the shared check, hami.testing.isolation.MonitorTests)."""

from __future__ import annotations

from hami.testing.isolation import MonitorTests


class TestMonitor(MonitorTests):
    kind = "DCU"
    uuid_variable = "HIP_DEVICE_UUIDS"
    device_uuid = "DCU-PD23010000"
    kernel_ns_variable = "FAKE_DCU_KERNEL_NS"
