"""The node daemon's usage collection at 8 devices and 64 containers: CPU per scrape and per second, and memory.

    python benchmarks/node_usage.py                          # 8 devices, 64 containers, 20 rounds
    python benchmarks/node_usage.py --devices 8 --containers 128 --rounds 50

What the daemon does for usage, with its real code: 64 served containers, 8 per device, each with an accounting file
in the isolation libraries' layout (`hami.isolation` LAYOUT.md: one process slot, its memory and the device time
charged, advancing between rounds as a running container's would; files of the layout's full size, 1 MiB); the
vendors' device readings (a reader standing in for `hami_device_readings`: NVML's own cost is the driver's, not
measured here). Per round it does what a minute of a node daemon's life asks at the default settings, scaled to one
scrape: `NodeMonitor.render()` (a Prometheus or dashboard scrape: every HAMi and HAMi-WebUI family, reading every
accounting file) served over HTTP and read back as a scraper would, and `BusyPublisher.publish` (measure, compare,
patch the Node when it moved) on an in-memory cluster. As the baseline in the same run, the same scrape with no usage
readers (grants only, what the monitor cost before usage was read).

CPU is the process's (`time.process_time`) per round, median; the share of one core assumes a Prometheus scrape every
15 s and the dashboard's every 30 s, plus one publish every 30 s (the defaults). Memory: the peak one round allocates
(tracemalloc) and the resident size after the run. The budget is 2 % of one core. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import struct
import tempfile
import time
import tracemalloc
import urllib.request
from pathlib import Path
from typing import Any

from hami.cluster import MemoryCluster
from hami.isolation.accounting import MAGIC, VERSION
from hami.model import ContainerDevice, Device, DeviceReading, NodeInventory
from hami.node.busy import BusyPublisher, measure_busy
from hami.node.monitor import NodeMonitor
from hami.node.pods import ServedContainer
from hami.node.usage import AccountingReader

BUDGET_CORE_PCT = 2.0
SCRAPES_PER_SECOND = 1 / 15 + 1 / 30
PUBLISHES_PER_SECOND = 1 / 30
HEADER, SLOT, SLOTS, DEVICE_SLOTS = 8192, 1024, 1024, 16
MIB = 1 << 20


def write_accounting(path: Path, memory: int, device_time_ns: int, now_ns: int, pid: int) -> None:
    """An accounting file as the isolation library leaves it for one process using device 0 (LAYOUT.md): its full
    size (header and 1,024 slots), one slot used."""
    data = bytearray(HEADER + SLOT * SLOTS)
    struct.pack_into("<QIIIIIIQQI", data, 0, MAGIC, VERSION, HEADER, SLOT, SLOTS, DEVICE_SLOTS, 1, now_ns, now_ns, 1)
    struct.pack_into("<I", data, 52, 1)  # processes
    data[64:70] = b"nvidia"
    device = 1024  # device record 0
    struct.pack_into("<QQQ", data, device, memory, 4096 * MIB, memory)  # used, limit, peak
    struct.pack_into("<I", data, device + 80, 25)  # core_limit
    struct.pack_into("<QQQ", data, device + 144, now_ns, 1000, device_time_ns)  # last kernel, launches, time
    struct.pack_into("<QIIQ", data, HEADER, pid, 1, 0, 12345)  # slot 0: pid, state, pad, start time
    path.write_bytes(bytes(data))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--containers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="hami-node-usage-"))
    inventory = {
        "NVIDIA": NodeInventory(
            kind="NVIDIA",
            devices=tuple(
                Device(id=f"GPU-{i}", index=i, devmem=81920, type="NVIDIA-H100") for i in range(args.devices)
            ),
        )
    }
    served = []
    for n in range(args.containers):
        uuid = f"GPU-{n % args.devices}"
        path = folder / f"c{n}.cache"
        served.append(
            ServedContainer(
                "bench", f"pod-{n}", f"uid-{n}", "main", 0, "NVIDIA",
                (ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=4096, usedcores=25),), accounting_file=str(path),
            )
        )  # fmt: skip
    readings = [
        DeviceReading(device_uuid=f"GPU-{i}", memory_used_bytes=i * 1000 * MIB, utilization_percent=10.0 * i,
                      power_watts=200.0, temperature_celsius=50.0)
        for i in range(args.devices)
    ]  # fmt: skip

    def advance(round_: int) -> None:
        now = time.time_ns()
        for n, c in enumerate(served):
            assert c.accounting_file is not None
            write_accounting(Path(c.accounting_file), (512 + n) * MIB, round_ * 3_000_000_000, now, 1000 + n)

    accounting = AccountingReader(lambda: served)
    monitor = NodeMonitor(
        "bench-node", lambda: inventory, lambda: served, container_usage=accounting, device_usage=lambda: readings
    )
    baseline = NodeMonitor("bench-node", lambda: inventory, lambda: served)
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": "bench-node"}})
    publisher = BusyPublisher(cluster, "bench-node", lambda: measure_busy(inventory, readings, accounting()))

    def scrape(server: Any) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as answer:
            return len(answer.read())

    served_usage, served_plain = monitor.serve(("127.0.0.1", 0)), baseline.serve(("127.0.0.1", 0))
    scrape_s, plain_s, publish_s = [], [], []
    size = plain_size = 0
    try:
        advance(0)
        scrape(served_usage)  # the first scrape of a container only records where its counters start
        for r in range(1, args.rounds + 1):
            advance(r)
            gc.collect()
            t0 = time.process_time()
            size = scrape(served_usage)
            scrape_s.append(time.process_time() - t0)
            t0 = time.process_time()
            plain_size = scrape(served_plain)
            plain_s.append(time.process_time() - t0)
            t0 = time.process_time()
            publisher.publish()
            publish_s.append(time.process_time() - t0)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        advance(args.rounds + 1)
        monitor.render()
        peak = (tracemalloc.get_traced_memory()[1] - base) / MIB
        tracemalloc.stop()
    finally:
        served_usage.stop()
        served_plain.stop()
    rss = next(
        int(line.split()[1]) / 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    scrape_ms, plain_ms, publish_ms = (statistics.median(v) * 1000 for v in (scrape_s, plain_s, publish_s))
    core_pct = (scrape_ms * SCRAPES_PER_SECOND + publish_ms * PUBLISHES_PER_SECOND) / 10
    plain_pct = plain_ms * SCRAPES_PER_SECOND / 10
    print(f"{args.devices} devices, {args.containers} containers, {args.rounds} rounds")
    print(
        f"scrape with usage: {scrape_ms:.2f} ms CPU ({size} bytes); "
        f"without (grants only): {plain_ms:.2f} ms ({plain_size} bytes)"
    )
    print(f"busy publish: {publish_ms:.2f} ms CPU; Node writes {publisher.writes}")
    print(
        f"share of one core (scrapes every 15 s and 30 s, a publish every 30 s): {core_pct:.3f}% with usage, "
        f"{plain_pct:.3f}% without"
    )
    print(f"peak allocated by one scrape: {peak:.2f} MiB; resident after the run: {rss:.0f} MiB")
    print(
        json.dumps(
            {
                "devices": args.devices,
                "containers": args.containers,
                "scrape_cpu_ms": round(scrape_ms, 3),
                "scrape_cpu_ms_without_usage": round(plain_ms, 3),
                "publish_cpu_ms": round(publish_ms, 3),
                "node_writes": publisher.writes,
                "core_pct": round(core_pct, 3),
                "core_pct_without_usage": round(plain_pct, 3),
                "scrape_peak_mib": round(peak, 2),
                "rss_mib": round(rss, 1),
                "scrape_bytes": size,
                "budget_core_pct": BUDGET_CORE_PCT,
                "within_budget": core_pct <= BUDGET_CORE_PCT,
            }
        )
    )


if __name__ == "__main__":
    main()
