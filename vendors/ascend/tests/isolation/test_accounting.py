"""hami.isolation.accounting reads what libvnpu.so writes: the container's devices (UUIDs from
ASCEND_DEVICE_UUIDS, limits), its processes and what each holds, launches and device time."""

from __future__ import annotations

import time

from hami.isolation import accounting

MIB = 1 << 20
UUID = "0A1B2C3D-00000000-11111111-22222222-33333333"


def test_reader_sees_the_devices_and_processes_the_library_wrote(sandbox):
    env = sandbox.env(
        memory="64m",
        cores=40,
        extra={"ASCEND_DEVICE_UUIDS": UUID, "ASCEND_TASK_PRIORITY": "0", "FAKE_NPU_KERNEL_NS": "200000"},
    )
    holder = sandbox.start("hold", 12 * MIB, 3, env=env)
    assert holder.stdout.readline().strip() == "held"
    sandbox.client("launch", 0.3, "kernel", 64, env=env)
    started = time.time_ns()

    account = sandbox.account()
    assert account.version == accounting.VERSION
    assert account.vendor == "ascend"
    assert account.device_count == 1
    assert account.priority == 0
    device = account.device(0)
    assert (device.uuid, device.memory_limit, device.core_limit, device.policy) == (UUID, 64 * MIB, 40, "default")
    assert device.memory_used == 12 * MIB
    assert device.launches > 0
    assert device.device_time_ns > 0
    assert started - 10**9 < device.last_kernel_ns <= started
    (process,) = account.processes  # the launcher exited holding nothing: its slot is gone
    assert process.pid == holder.pid
    assert process.memory_used == 12 * MIB
    assert process.devices[0].memory_used == 12 * MIB
