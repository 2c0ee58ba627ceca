"""hami.isolation.accounting reads what libvdcu.so writes, which is what the node daemon's monitor reports per
container: the devices (UUIDs from HIP_DEVICE_UUIDS, limits), the processes and what each holds, launches."""

from __future__ import annotations

from hami.isolation import accounting

MIB = 1 << 20
UUID = "DCU-PD23010000"


def test_reader_sees_the_devices_and_processes_the_library_wrote(sandbox):
    env = sandbox.env(memory="64m", cores=40, extra={"HIP_DEVICE_UUIDS": UUID, "FAKE_DCU_KERNEL_NS": "200000"})
    holder = sandbox.start("hold", 12 * MIB, 3, env=env)
    assert holder.stdout.readline().strip() == "held"
    sandbox.client("launch", 0.3, "kernel", 64, env=env)
    account = sandbox.account()
    assert account.version == accounting.VERSION
    assert account.vendor == "hygon"
    device = account.device(0)
    assert (device.uuid, device.memory_limit, device.core_limit) == (UUID, 64 * MIB, 40)
    assert device.memory_used == 12 * MIB
    assert device.launches > 0
    (process,) = account.processes
    assert process.pid == holder.pid
    assert process.memory_used == 12 * MIB
