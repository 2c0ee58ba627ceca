"""The compute split of two containers at 10 % and 90 % of one device, per vendor, with blurred event timing.

    python benchmarks/isolation_split.py [--vendors nvidia,ascend,...] [--window 2.0] [--runs 1]

For each vendor, builds the fakes and client of its isolation tests (``vendors/<name>/tests/isolation``, the same
sandbox) and starts two containers launching 4 ms kernels under its installed isolation library, one limited to
10 %, one to 90 %, on a fake device whose events are reached when the launching process's own earlier work is done
(``<FAKE>EVENT_TIMING=queued``: a device that time-slices contexts, where a launch's events also time the other
container's queued work). The shares are read from the fake device's timeline over `window` seconds after a 1 s
warm-up. Where a vendor's layer asks the device what it ran for each process (``hami_iso_vendor.device_busy``: the
CUDA layer's NVML-compatible library, so NVIDIA and Iluvatar) the split holds by that; elsewhere the limiter has its
event timing alone. Prints one line per vendor and run, and last one JSON object: vendor -> the ratios measured
(1:x, x given). A benchmark, not a test: nothing is asserted.

Measured 2026-12-05 on the loaded 2-core host, two runs each: NVIDIA 1:9.9, 1:10.4; Iluvatar 1:9.6, 1:10.1 (both held
by the fake NVML's per-process utilization); Moore Threads 1:11.1, 1:11.5; Hygon 1:17.3, 1:11.1; MetaX 1:10.7,
1:11.3; Ascend 1:11.4, 1:11.2; Cambricon 1:16.1, 1:11.2 (event timing alone).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from hami.testing.isolation import device_shares
from hami.testing.isolation_benchmark import load_setup
from hami.testing.sandbox import Sandbox, prepare

ROOT = Path(__file__).resolve().parents[1]
# vendor -> (launch mode of its client, blocks per launch)
LAUNCHES = {
    "nvidia": ("kernel", 132),
    "iluvatar": ("kernel", 132),
    "mthreads": ("kernel", 132),
    "hygon": ("kernel", 16),
    "metax": ("kernel", 16),
    "ascend": ("kernel", 16),
    "cambricon": ("rt", 16),
}


def split(vendor: str, window: float) -> float:
    """One run: the 90 % container's share over the 10 % one's."""
    setup = load_setup(ROOT / "vendors" / vendor / "tests" / "isolation" / "conftest.py")
    prefix = setup.fake_state_variable.removesuffix("STATE")
    mode, blocks = LAUNCHES[vendor]
    with tempfile.TemporaryDirectory(prefix=f"split-{vendor}-") as scratch:
        out = Path(scratch) / "build"
        out.mkdir()
        build = prepare(setup, out)
        with Sandbox(build, Path(scratch)) as sandbox:
            timing = {prefix + "KERNEL_NS": "4000000", prefix + "EVENT_TIMING": "queued"}
            run = str(1.2 + window)
            for name, cores, tag in (("low", 10, "0"), ("high", 90, "1")):
                env = sandbox.env(name, cores=cores, extra={**timing, prefix + "TAG": tag})
                sandbox.start("launch", run, mode, blocks, env=env)
            low, high = device_shares(sandbox, [0, 1], warmup=1.0, window=window)
            time.sleep(0.3)
    return high / low if low else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vendors", default=",".join(LAUNCHES), help="comma-separated vendor names")
    parser.add_argument("--window", type=float, default=2.0, help="seconds measured after a 1 s warm-up")
    parser.add_argument("--runs", type=int, default=1, help="runs per vendor")
    args = parser.parse_args()
    found: dict[str, list[float]] = {}
    for vendor in args.vendors.split(","):
        for _ in range(args.runs):
            ratio = split(vendor, args.window)
            found.setdefault(vendor, []).append(round(ratio, 2))
            print(f"{vendor}: 10:90 with queued timing measured 1:{ratio:.2f}", flush=True)
    print(json.dumps(found))


if __name__ == "__main__":
    main()
