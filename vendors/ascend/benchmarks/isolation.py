"""Isolation library overhead: what libvnpu.so adds to runtime calls, and how fast a container's processes start.

    python vendors/ascend/benchmarks/isolation.py [--rounds 200000] [--json]

Builds the fake runtime and AscendCL and the client program of ``vendors/ascend/tests/isolation`` with the system C
compiler, then times, in the client (best of 7 rounds, best of 3 processes), each call against the fake stack alone
and with the installed ``libvnpu.so`` preloaded:

- an allocate+free pair at the runtime layer (``rtMalloc`` + ``rtFree`` of 1 MiB under a memory limit), and the same
  through AscendCL (``aclrtMalloc`` + ``aclrtFree``: the AscendCL hook reserves, the runtime hook underneath takes
  the reservation over, both frees look the pointer up); the fake keeps no host memory behind allocations;
- a launch (``rtKernelLaunch``) without a compute limit, and with one (the fake kernel takes no time, so the
  limiter never waits: this is its bookkeeping cost);
- a memory-info query (``rtMemGetInfoEx``, under a memory limit);
- 200 processes of one container started at once, each initializing (its slot, an allocation refused over the
  limit, one allocated): wall time until all have exited.

Prints one line per figure and, last, one JSON object. DESIGN.md's budgets for NVIDIA's library, which this one
meets the same way: pair <= 300 ns, launch <= 15 ns, limited launch <= 30 ns, memory info <= 100 ns. A benchmark,
not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests" / "isolation"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-pthread"]
BUDGETS = {
    "alloc_free_overhead_ns": 300,
    "acl_alloc_free_overhead_ns": 300,
    "launch_overhead_ns": 15,
    "launch_overhead_limited_ns": 30,
    "meminfo_overhead_ns": 100,
    "startup_200_procs_s": 2,
}
STARTUP_LIMIT = 1 << 20


def library() -> Path:
    path = Path(str(importlib.resources.files("hami_vendor_ascend") / "lib" / "libvnpu.so"))
    if not path.is_file():
        sys.exit(f"{path} is missing: install hami-vendor-ascend (`uv pip install -e ./vendors/ascend`)")
    return path


def build(out: Path) -> Path:
    """Compile the fake stack and the client into `out`; returns the client."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        sys.exit("a C compiler is needed to build the fake runtime")
    shared = ["-fPIC", "-shared", "-fvisibility=hidden"]
    steps = [
        [*shared, "-Wl,-Bsymbolic", "-Wl,-soname,libruntime.so", TESTS / "fake_runtime.c", "-o", out / "libruntime.so"],
        [*shared, "-Wl,-soname,libascendcl.so", TESTS / "fake_acl.c", f"-L{out}", "-lruntime", "-o",
         out / "libascendcl.so"],
        [TESTS / "client.c", f"-L{out}", "-lascendcl", "-lruntime", f"-Wl,-rpath-link,{out}", "-o", out / "client"],
    ]  # fmt: skip
    for step in steps:
        subprocess.run([cc, *CFLAGS, *map(str, step)], check=True)
    return out / "client"


def environment(out: Path, preload: Path | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ASCEND_", "FAKE_NPU", "HAMI_", "LIBVNPU")) and k != "LD_PRELOAD"
    }
    env.update(LD_LIBRARY_PATH=str(out), FAKE_NPU_NO_BACKING="1", LIBVNPU_LOG_LEVEL="0")
    env["ASCEND_DEVICE_MEMORY_SHARED_CACHE"] = str(out / f"bench-{os.getpid()}-{len(extra)}.cache")
    if preload:
        env["LD_PRELOAD"] = str(preload)
    env.update(extra)
    return env


def per_call_ns(client: Path, what: str, rounds: int, env: dict[str, str]) -> float:
    best = float("inf")
    for _ in range(3):
        out = subprocess.run(
            [str(client), "bench", what, str(rounds)], env=env, capture_output=True, text=True, check=True
        )
        best = min(best, float(json.loads(out.stdout.strip().splitlines()[-1])["ns"]))
    return best


def startup_seconds(client: Path, count: int, env: dict[str, str]) -> tuple[float, int]:
    argv = [str(client), "spawn", str(count), "--", str(client), "init", str(STARTUP_LIMIT)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), int(result["failed"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200_000, help="calls per timed round")
    parser.add_argument("--processes", type=int, default=200, help="processes started at once")
    parser.add_argument("--json", action="store_true", help="only the JSON line")
    args = parser.parse_args()

    libvnpu = library()
    with tempfile.TemporaryDirectory(prefix="hami-vnpu-bench-") as tmp:
        out = Path(tmp)
        client = build(out)
        limits = {"ASCEND_DEVICE_MEMORY_LIMIT": "8g"}
        bare, hooked = environment(out, None), environment(out, libvnpu, **limits)
        limited = environment(out, libvnpu, ASCEND_DEVICE_CORE_LIMIT="50", **limits)
        figures: dict[str, float] = {}
        raw: dict[str, float] = {}
        for key, what, env in [
            ("alloc_free_overhead_ns", "alloc", hooked),
            ("acl_alloc_free_overhead_ns", "aclalloc", hooked),
            ("launch_overhead_ns", "launch", environment(out, libvnpu)),
            ("launch_overhead_limited_ns", "launch", limited),
            ("meminfo_overhead_ns", "meminfo", hooked),
        ]:
            if what not in raw:
                raw[what] = per_call_ns(client, what, args.rounds, bare)
            figures[key] = round(max(0.0, per_call_ns(client, what, args.rounds, env) - raw[what]), 1)
        container = environment(out, libvnpu, ASCEND_DEVICE_MEMORY_LIMIT=str(STARTUP_LIMIT))
        seconds, failed = startup_seconds(client, args.processes, container)
        figures[f"startup_{args.processes}_procs_s"] = round(seconds, 3)
        figures["startup_failed"] = failed

    if not args.json:
        print(f"fake stack alone: rtMalloc+rtFree {raw['alloc']:.1f} ns, aclrtMalloc+aclrtFree {raw['aclalloc']:.1f} "
              f"ns, launch {raw['launch']:.1f} ns, memory info {raw['meminfo']:.1f} ns")  # fmt: skip
        for key, value in figures.items():
            budget = BUDGETS.get(key)
            note = f"  (budget {budget})" if budget is not None else ""
            print(f"{key:<30} {value}{note}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
