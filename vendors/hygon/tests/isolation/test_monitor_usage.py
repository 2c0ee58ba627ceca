"""The node monitor reads what libvdcu.so accounts in the soft mode: a served DCU container's memory in use, its
limit and its device time (the per-container hami_* families of the node daemon)."""

from __future__ import annotations

from hami.model import ContainerDevice
from hami.node.pods import ServedContainer
from hami.node.usage import AccountingReader

MIB = 1 << 20
UUID = "DCU-PD23010000"


def test_monitor_reads_the_library_accounting_of_a_served_container(sandbox):
    env = sandbox.env(memory="64m", cores=50, extra={"HIP_DEVICE_UUIDS": UUID, "FAKE_DCU_KERNEL_NS": "200000"})
    served = ServedContainer(
        "default", "p", "uid-1", "dcu", 0, "DCU",
        (ContainerDevice(uuid=UUID, type="DCU", usedmem=64, usedcores=50),), str(sandbox.cache()),
    )  # fmt: skip
    reader = AccountingReader(lambda: [served])
    assert reader() == []  # no process has started: no file yet, no record
    holder = sandbox.start("hold", 12 * MIB, 2, env=env)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "held"
    first = reader()
    sandbox.client("launch", "0.3", "kernel", 64, env=env)
    (usage,) = reader()
    assert (usage.pod_uid, usage.container, usage.device_uuid) == ("uid-1", "dcu", UUID)
    assert usage.memory_used_bytes == 12 * MIB
    assert usage.memory_limit_bytes == 64 * MIB
    assert first[0].utilization_ratio == 0  # first look: no interval to measure over yet
    assert 0 < usage.utilization_ratio <= 1
    assert usage.last_kernel_elapsed_seconds < 5
