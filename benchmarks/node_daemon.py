"""Node daemon: Allocate latency through the real socket, and the daemon's resident memory.

    python benchmarks/node_daemon.py --pods 300 --json

Starts the real daemon process (`python -m hami.node`) with every installed vendor plugin loaded plus the
test suite's scripted vendor (4 devices, split 10; with its dummy isolation library when a C compiler is
there), against the fake kubelet and the test suite's fake Kubernetes API server (real HTTP, so the daemon
uses `KubeCluster`). Then, PODS times, does what the scheduler and the kubelet do for one pod: the pod is
created with its placement, `bind-phase: allocating` and the node lock, and the kubelet's `Allocate` is
timed from the call on the plugin's socket to the answer. Each Allocate reads the node and the pod, empties
the to-allocate entry, marks the pod allocated and releases the lock: six API round trips, which dominate.

Prints percentiles and memory, and last one JSON object: pods, allocate_p50_ms, allocate_p99_ms,
allocate_max_ms, rss_mb (resident after the run), rss_peak_mb (high-water mark, reached while loading the
plugins, before the daemon hands the heap start-up left free back to the OS), vendors, budget.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))

from fake_apiserver import FakeApiServer
from node_harness import (
    NODE,
    DaemonProcess,
    dev,
    free_port,
    install_scripted_vendor,
    place_pod,
    scripted_devices,
    write_script,
)

from hami.testing.kubelet import FakeKubelet

RESOURCE = "scripted.example/accel"
BUDGET = {"allocate_p99_ms": 20.0, "rss_mb": 80.0}


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MB, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def library(directory: Path) -> Path | None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    source = directory / "dummy.c"
    source.write_text("int hami_dummy_isolation(void) { return 1; }\n")
    out = directory / "libscripted.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(out), str(source)], check=True, capture_output=True)
    return out


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(pods: int, warmup: int) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="hami-node-bench-"))
    site = install_scripted_vendor(tmp / "site", library(tmp))
    script = write_script(tmp / "script.json", {"Scripted": scripted_devices(4, count=10, devmem=81920)})
    config = tmp / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"scripted": {"script": str(script)}}}))
    api = FakeApiServer().start()
    api.cluster.create("nodes", {"metadata": {"name": NODE}})
    kubelet = FakeKubelet().start()
    args = ["--config", str(config), "--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
    args += ["--node-name", NODE, "--device-plugin-dir", str(kubelet.directory), "--hook-dir", str(tmp / "hooks")]
    args += ["--metrics-listen", f"127.0.0.1:{free_port()}"]
    daemon = DaemonProcess(args, site, tmp / "daemon.log", env={"PYTHONUNBUFFERED": "1"})
    try:
        kubelet.wait_for_registration(RESOURCE, timeout=60)
        devices = kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 40)
        client = kubelet.client(RESOURCE)
        latencies = []
        for i in range(warmup + pods):
            card = f"SCR-{i % 4}"
            placement = {"Scripted": [[dev(card, mem=1000, cores=5)]]}
            place_pod(api.cluster, NODE, f"bench-{i}", placement, namespace="bench")
            ids = [d.id for d in devices if d.id.startswith(card + "-")][:1]
            started = time.perf_counter()
            edits = client.allocate([ids])
            elapsed = (time.perf_counter() - started) * 1000
            assert edits[0].env["SCRIPTED_VISIBLE_DEVICES"] == card
            if i >= warmup:
                latencies.append(elapsed)
            if i % 50 == 49:  # finished pods leave, as they would on a node
                for j in range(i - 49, i + 1):
                    api.cluster.delete("pods", f"bench-{j}", "bench")
        rss, peak = memory_mb(daemon.pid)
    finally:
        status = daemon.terminate()
        kubelet.stop()
        api.stop()
        log = daemon.log()
        shutil.rmtree(tmp, ignore_errors=True)
    if status != 0:
        raise SystemExit(f"the daemon exited with {status}:\n{log[-3000:]}")
    loaded = re.search(r"vendors ([^;]*);", log)
    vendors = loaded.group(1).split(", ") if loaded else []
    return {
        "pods": pods,
        "allocate_p50_ms": round(statistics.median(latencies), 2),
        "allocate_p99_ms": round(percentile(latencies, 99), 2),
        "allocate_max_ms": round(max(latencies), 2),
        "rss_mb": round(rss, 1),
        "rss_peak_mb": round(peak, 1),
        "vendors": vendors,
        "budget": BUDGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=300, help="Allocate calls measured (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="Allocate calls before measuring (default 20)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line (always printed last)")
    args = parser.parse_args()
    result = run(args.pods, args.warmup)
    p50, p99, worst = result["allocate_p50_ms"], result["allocate_p99_ms"], result["allocate_max_ms"]
    print(f"Allocate over the socket, {args.pods} pods: p50 {p50} ms, p99 {p99} ms, max {worst} ms (budget p99 20 ms)")
    print(f"daemon resident memory: {result['rss_mb']} MB, peak {result['rss_peak_mb']} MB (budget 80 MB)")
    print(f"vendors loaded: {', '.join(result['vendors'])}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
