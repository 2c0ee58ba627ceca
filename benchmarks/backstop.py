"""The node daemon's backstop: CPU per round on a node of 8 devices and 64 containers, at a 1 s and a 5 s interval.

    python benchmarks/backstop.py [--devices 8] [--containers 64] [--rounds 20] [--json]

Runs `hami.node.backstop.Backstop.check()` as the daemon's worker thread does, every `interval` seconds, over
`containers` containers spread over `devices` devices (one process each, within its grant), with the kernel's
record of each process (``/proc/<pid>/cgroup``, ``status`` with ``NSpid:``, ``ns/pid``) in a /proc tree of the
benchmark, as the kubelet's cgroup paths and a container's pid namespace show them, each container's grant
directory, where the round writes the pid map, and its accounting file, which the round reads for the library's
tampering count. The vendor's answer (`hami_device_processes`) is a fixed list: the management library's own cost
is not in these figures (NVML's process list is a few calls per device). Times the process's CPU (user + system)
per round with `time.process_time`, and the share of one core it takes at each interval (the same rounds, the 5 s
figure being the baseline of the daemon as it was). Prints the figures and, last, one JSON object:
cpu_ms_per_round (median), cpu_ms_p90, core_percent_at_1s, core_percent_at_5s, devices, containers, rounds.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import cast

from hami.cluster.memory import MemoryCluster
from hami.isolation.accounting import MAGIC
from hami.model import ContainerDevice, DeviceProcess
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins

MiB = 1 << 20
HOST_PID_NAMESPACE = 4026531836


class FixedProcesses:
    """The part of a VendorPlugins the backstop asks: every container's process, as a management library lists them."""

    def __init__(self, processes: list[DeviceProcess]) -> None:
        self.processes = processes

    def device_processes(self, common_word: str) -> list[DeviceProcess]:
        return list(self.processes)


def node(root: Path, devices: int, containers: int) -> tuple[Backstop, list[ServedContainer]]:
    """A backstop over `containers` containers of one pod each, on `devices` devices, each container's process
    pid 1 of its own pid namespace."""
    proc = root / "proc"
    served, processes = [], []
    for i in range(containers):
        pid, uid = 100_000 + i, f"{i:08x}-0000-4000-8000-{i:012x}"
        container_id = f"{i:064x}"
        uuid = f"GPU-{i % devices:08x}-0000-0000-0000-000000000000"
        base = proc / str(pid)
        (base / "ns").mkdir(parents=True)
        slice_uid = uid.replace("-", "_")
        (base / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id}.scope\n"
        )
        (base / "status").write_text(f"Name:\tpython3\nPid:\t{pid}\nNSpid:\t{pid}\t1\nThreads:\t4\n")
        (base / "ns" / "pid").symlink_to(f"pid:[{HOST_PID_NAMESPACE + 1 + i}]")
        grant = root / "grants" / f"{uid}_main"
        grant.mkdir(parents=True)
        accounting = root / "accounting" / f"{uid}_main.cache"
        accounting.parent.mkdir(exist_ok=True)
        header = bytearray(8192 + 1024)  # the isolation library's file (LAYOUT.md): one device, one process
        struct.pack_into("<QIIIIIIQQI", header, 0, MAGIC, 1, 8192, 1024, 1024, 16, 1, 0, 0, 1)
        struct.pack_into("<QQQ", header, 1024, 3000 * MiB, 4096 * MiB, 3000 * MiB)
        struct.pack_into("<iIQ", header, 8192, 1, 1, 0)
        accounting.write_bytes(bytes(header))
        device = ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=4096, usedcores=10)
        served.append(
            ServedContainer("team", f"pod-{i}", uid, "main", 0, "NVIDIA", (device,), str(accounting), str(grant))
        )
        processes.append(DeviceProcess(device_uuid=uuid, pid=pid, used_bytes=3000 * MiB))
    plugins = cast(VendorPlugins, FixedProcesses(processes))
    settings = BackstopSettings(proc_root=proc)
    return Backstop(plugins, MemoryCluster(), lambda: served, settings), served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds (the daemon's timer)")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="backstop-bench-") as scratch:
        backstop, _ = node(Path(scratch), args.devices, args.containers)
        backstop.check()  # the first round writes every pid map
        costs = []
        for _ in range(args.rounds):
            started, cpu = time.monotonic(), time.process_time()
            found = backstop.check()
            costs.append((time.process_time() - cpu) * 1000)
            assert not found, "a container of the benchmark went over its grant"
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    median = statistics.median(costs)
    result = {
        "cpu_ms_per_round": round(median, 2),
        "cpu_ms_p90": round(statistics.quantiles(costs, n=10)[-1], 2),
        "core_percent_at_1s": round(median / 1000 * 100, 2),
        "core_percent_at_5s": round(median / 5000 * 100, 3),
        "devices": args.devices,
        "containers": args.containers,
        "rounds": args.rounds,
    }
    if not args.json:
        print(f"{args.containers} containers on {args.devices} devices: {median:.2f} ms of CPU per round (median)")
        print(f"one core: {result['core_percent_at_1s']} % at 1 s, {result['core_percent_at_5s']} % at 5 s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
