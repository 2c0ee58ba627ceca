"""The node daemon's backstop: CPU per round on a node of 8 devices and 64 containers, at a 1 s and a 5 s interval,
with the processes from a management library (the baseline) and from the kernel's DRM fdinfo, in the same run.

    python benchmarks/backstop.py [--devices 8] [--containers 64] [--rounds 20] [--fds 64] [--host-processes 300]
                                  [--json]

Runs `hami.node.backstop.Backstop.check()` as the daemon's worker thread does, every `interval` seconds, over
`containers` containers spread over `devices` devices (one process each, within its grant), with the kernel's
record of each process (``/proc/<pid>/cgroup``, ``status`` with ``NSpid:``, ``ns/pid``) in a /proc tree of the
benchmark, as the kubelet's cgroup paths and a container's pid namespace show them, each container's grant
directory, where the round writes the pid map, and its accounting file, which the round reads for the library's
tampering count. The vendor's answer (`hami_device_processes`) is a fixed list: the management library's own cost
is not in these figures (NVML's process list is a few calls per device). Times the process's CPU (user + system)
per round with `time.process_time`, and the share of one core it takes at each interval (the same rounds, the 5 s
figure being the baseline of the daemon as it was).

The fdinfo case is the same node served by a vendor whose management library has no per-process memory and which
gives a DRM source (`hami_drm_usage_source`, amdgpu's keys): each round the backstop finds the served pods' processes
by reading the cgroup of every process under /proc (`--host-processes` more that belong to no pod), follows each of
their `--fds` descriptors (one open on the DRM device, three on other character devices, a fifth on regular files,
the rest anonymous: sockets, pipes, eventfds) and reads the fdinfo of those on a character device. The two cases
alternate round by round. The tree is on this machine's disk (page cache), not the kernel's procfs: a last figure
times the same reader over this process in the real /proc, holding as many descriptors in the same mix (best of 200
wall-clock runs), for the procfs's own cost per descriptor.

Prints the figures and, last, one JSON object: cpu_ms_per_round (median, the baseline), cpu_ms_p90,
core_percent_at_1s, core_percent_at_5s, fdinfo_cpu_ms_per_round, fdinfo_cpu_ms_p90, fdinfo_core_percent_at_1s,
real_proc_us_per_descriptor, devices, containers, fds, host_processes, rounds.
A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import struct
import tempfile
import time
from pathlib import Path
from typing import cast

from hami.cluster.memory import MemoryCluster
from hami.drmfdinfo import read_process
from hami.isolation.accounting import MAGIC
from hami.model import ContainerDevice, DeviceProcess, DrmUsageSource
from hami.node.backstop import Backstop, BackstopSettings
from hami.node.pods import ServedContainer
from hami.plugins import VendorPlugins

MiB = 1 << 20
HOST_PID_NAMESPACE = 4026531836


class FixedProcesses:
    """The part of a VendorPlugins the backstop asks: every container's process, as a management library lists them
    (`processes`), or none and a DRM source (`drm`)."""

    def __init__(self, processes: list[DeviceProcess] | None, drm: DrmUsageSource | None = None) -> None:
        self.processes, self.drm = processes, drm

    def device_processes(self, common_word: str) -> list[DeviceProcess] | None:
        return None if self.processes is None else list(self.processes)

    def drm_usage_source(self, common_word: str) -> DrmUsageSource | None:
        return self.drm


def bus_of(device: int) -> str:
    return f"0000:{0x10 + device:02x}:00.0"


def descriptors(base: Path, files: Path, fds: int, device: int, client: int) -> None:
    """`fds` descriptors of one process: one on the DRM device (amdgpu's fdinfo), three on other character devices,
    a fifth on regular files, the rest anonymous objects (whose links reach no path)."""
    (base / "fd").mkdir()
    (base / "fdinfo").mkdir()
    for fd in range(fds):
        if fd == 3:
            target = "/dev/null"
            text = (
                f"pos:\t0\nflags:\t02100002\nmnt_id:\t26\nino:\t1093\ndrm-driver:\tamdgpu\n"
                f"drm-pdev:\t{bus_of(device)}\ndrm-client-id:\t{client}\ndrm-memory-vram:\t3072000 KiB\n"
                "drm-memory-gtt:\t8192 KiB\ndrm-memory-cpu:\t0 KiB\ndrm-engine-gfx:\t1000 ns\n"
            )
        elif fd < 3 or fd == 4:
            target, text = "/dev/null", "pos:\t0\nflags:\t0100002\nmnt_id:\t5\nino:\t4\n"
        elif fd % 5 == 0:
            target, text = str(files / "log"), "pos:\t812\nflags:\t02102001\nmnt_id:\t30\nino:\t2231\n"
        else:
            target, text = f"socket:[{81000 + fd}]", "pos:\t0\nflags:\t02000002\nmnt_id:\t8\nino:\t81000\n"
        (base / "fd" / str(fd)).symlink_to(target)
        (base / "fdinfo" / str(fd)).write_text(text)


def node(
    root: Path, devices: int, containers: int, *, fdinfo: bool = False, fds: int = 64, host_processes: int = 0
) -> tuple[Backstop, list[ServedContainer]]:
    """A backstop over `containers` containers of one pod each, on `devices` devices, each container's process
    pid 1 of its own pid namespace; with `fdinfo`, its device processes come from DRM fdinfo (see the module)."""
    proc = root / "proc"
    files = root / "files"
    files.mkdir(parents=True, exist_ok=True)
    (files / "log").write_text("")
    for h in range(host_processes):
        base = proc / str(10_000 + h)
        base.mkdir(parents=True)
        (base / "cgroup").write_text(f"0::/system.slice/service-{h}.service\n")
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
        if fdinfo:
            descriptors(base, files, fds, i % devices, client=1000 + i)
    drm = DrmUsageSource(
        drivers=("amdgpu",),
        devices={bus_of(d): f"GPU-{d:08x}-0000-0000-0000-000000000000" for d in range(devices)},
        memory_regions=("vram",),
        engines=("gfx",),
    )
    plugins = cast(VendorPlugins, FixedProcesses(None, drm) if fdinfo else FixedProcesses(processes))
    settings = BackstopSettings(proc_root=proc)
    return Backstop(plugins, MemoryCluster(), lambda: served, settings), served


def real_proc_cost(fds: int) -> float:
    """µs of CPU per descriptor for `read_process` over this process in the kernel's real /proc, holding `fds`
    descriptors in the fdinfo case's mix (three on /dev/null, a fifth on a regular file, the rest sockets)."""
    with contextlib.ExitStack() as stack, tempfile.NamedTemporaryFile() as regular:
        n = 0
        while len(os.listdir("/proc/self/fd")) < fds:
            if n < 3:
                stack.enter_context(open(os.devnull, "rb"))
            elif n % 5 == 0:
                stack.enter_context(open(regular.name, "rb"))
            else:
                stack.enter_context(socket.socket())
            n += 1
        count = len(os.listdir("/proc/self/fd"))
        best = float("inf")
        for _ in range(200):
            started = time.perf_counter()
            read_process(Path("/proc"), os.getpid())
            best = min(best, time.perf_counter() - started)
    return best * 1e6 / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--fds", type=int, default=64, help="descriptors of each container's process (fdinfo case)")
    parser.add_argument("--host-processes", type=int, default=300, help="processes of no pod (fdinfo case)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between rounds (the daemon's timer)")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="backstop-bench-") as scratch:
        library, _ = node(Path(scratch) / "library", args.devices, args.containers)
        drm, _ = node(
            Path(scratch) / "fdinfo", args.devices, args.containers, fdinfo=True, fds=args.fds,
            host_processes=args.host_processes,
        )  # fmt: skip
        costs: dict[str, list[float]] = {"library": [], "fdinfo": []}
        for backstop in (library, drm):
            backstop.check()  # the first round writes every pid map
        assert drm.drm.clients == args.containers, "the fdinfo case did not find every container's client"
        for _ in range(args.rounds):
            started = time.monotonic()
            for case, backstop in (("library", library), ("fdinfo", drm)):
                cpu = time.process_time()
                found = backstop.check()
                costs[case].append((time.process_time() - cpu) * 1000)
                assert not found, "a container of the benchmark went over its grant"
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
    per_fd = real_proc_cost(args.fds)
    median = statistics.median(costs["library"])
    fdinfo = statistics.median(costs["fdinfo"])
    result = {
        "cpu_ms_per_round": round(median, 2),
        "cpu_ms_p90": round(statistics.quantiles(costs["library"], n=10)[-1], 2),
        "core_percent_at_1s": round(median / 1000 * 100, 2),
        "core_percent_at_5s": round(median / 5000 * 100, 3),
        "fdinfo_cpu_ms_per_round": round(fdinfo, 2),
        "fdinfo_cpu_ms_p90": round(statistics.quantiles(costs["fdinfo"], n=10)[-1], 2),
        "fdinfo_core_percent_at_1s": round(fdinfo / 1000 * 100, 2),
        "real_proc_us_per_descriptor": round(per_fd, 2),
        "devices": args.devices,
        "containers": args.containers,
        "fds": args.fds,
        "host_processes": args.host_processes,
        "rounds": args.rounds,
    }
    if not args.json:
        print(f"{args.containers} containers on {args.devices} devices, management library: {median:.2f} ms of CPU "
              f"per round (median)")  # fmt: skip
        print(f"one core: {result['core_percent_at_1s']} % at 1 s, {result['core_percent_at_5s']} % at 5 s")
        print(f"the same from DRM fdinfo ({args.fds} descriptors a process, {args.host_processes} host processes): "
              f"{fdinfo:.2f} ms per round, {result['fdinfo_core_percent_at_1s']} % of a core at 1 s")  # fmt: skip
        print(f"this machine's real /proc: {per_fd:.2f} µs per descriptor of a process holding {args.fds}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
