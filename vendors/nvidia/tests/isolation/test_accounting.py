"""hami.isolation.accounting reads what the real library writes: the container's devices, its processes and what
each holds, launches and device time; and its control words reach the library. Its offsets are LAYOUT.md's."""

from __future__ import annotations

import re
import struct
import time

import pytest

from hami.isolation import accounting, source_dir

MIB = 1 << 20


def test_reader_sees_the_devices_and_processes_the_library_wrote(sandbox):
    env = sandbox.env(
        memory="64m",
        cores=40,
        extra={"NVIDIA_VISIBLE_DEVICES": "GPU-1234abcd", "CUDA_TASK_PRIORITY": "0", "FAKE_CUDA_KERNEL_NS": "200000"},
    )
    holder = sandbox.start("hold", 12 * MIB, 3, env=env)
    assert holder.stdout.readline().strip() == "held"
    sandbox.client("launch", 0.3, "kernel", 64, env=env)
    started = time.time_ns()

    account = sandbox.account()
    assert account.version == accounting.VERSION
    assert account.vendor == "nvidia"
    assert account.device_count == 1
    assert account.priority == 0
    device = account.device(0)
    assert (device.uuid, device.memory_limit, device.core_limit, device.policy) == (
        "GPU-1234abcd",
        64 * MIB,
        40,
        "default",
    )
    assert device.memory_used == 12 * MIB
    assert device.launches > 0
    assert device.device_time_ns > 0
    assert started - 10**9 < device.last_kernel_ns <= started
    (process,) = account.processes  # the launcher exited holding nothing: its slot is gone
    assert process.pid == holder.pid
    assert process.memory_used == 12 * MIB
    assert process.priority == 0
    assert process.devices[0].memory_used == 12 * MIB
    with open(f"/proc/{holder.pid}/stat") as stat:
        assert process.start_time == int(stat.read().rsplit(")", 1)[1].split()[19])


def test_control_words_written_by_the_reader_are_read_back(sandbox):
    sandbox.client("init", env=sandbox.env())
    until = time.time_ns() + 5 * 10**9
    accounting.set_device_control(sandbox.cache(), 0, accounting.ControlMode.YIELD, until)
    device = sandbox.account().device(0)
    assert (device.control_mode, device.control_until_ns) == (accounting.ControlMode.YIELD, until)
    accounting.set_device_control(sandbox.cache(), 0, accounting.ControlMode.NONE, 0)
    assert sandbox.account().device(0).control_mode == accounting.ControlMode.NONE


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short"),
        (b"x" * 9000, "does not start with the accounting magic"),
        (struct.pack("<QI", accounting.MAGIC, 99) + bytes(9000), "layout version 99"),
        (struct.pack("<QIIIIIIQQI", accounting.MAGIC, 1, 8192, 1024, 1024, 16, 1, 0, 0, 5) + bytes(100), "truncated"),
    ],
)
def test_reader_refuses_what_is_not_an_accounting_file_it_knows(tmp_path, content, message):
    path = tmp_path / "x.cache"
    path.write_bytes(content)
    with pytest.raises(accounting.AccountingFileError, match=message):
        accounting.read_accounting(path)


def test_reader_offsets_are_those_documented_in_layout_md():
    text = (source_dir() / "LAYOUT.md").read_text()
    device_table = text.split("### Device record", 1)[1].split("Control words", 1)[0]
    documented = {m[2]: int(m[1]) for m in re.finditer(r"^\| (\d+) \| \d+ \| `(\w+)` \|", device_table, re.M)}
    offsets = {name: offset for name, (offset, _) in accounting._DEVICE.items()}
    assert offsets == {name: documented[name] for name in offsets}
    assert "| 0 | 8 | `magic` | `0x54434341494d4148`" in text
    assert f"{accounting.MAGIC:#x}" == "0x54434341494d4148"
