"""Isolation library overhead: what libvgpu.so adds to driver calls, and how fast a container's processes start.

    python benchmarks/isolation.py [--rounds 200000] [--json]

Builds the fake CUDA driver and the client program of ``vendors/nvidia/tests/isolation`` with the system C compiler,
then times, in the client (best of 7 rounds, best of 3 processes), each call against the fake driver alone and with
the installed ``libvgpu.so`` preloaded:

- an allocate+free pair (``cuMemAlloc_v2`` + ``cuMemFree_v2`` of 1 MiB, under a memory limit; the fake keeps no host
  memory behind it, so that the driver's own cost stays small and steady);
- a launch (``cuLaunchKernel``) without a compute limit, and with one (the fake kernel takes no time, so the limiter
  never waits: this is its bookkeeping cost);
- a memory-info query (``cuMemGetInfo_v2``, under a memory limit);
- 200 processes of one container started at once, each initializing (cuInit, a context, its slot, an allocation
  refused over the limit, one allocated): wall time until all have exited.

Prints one line per figure and, last, one JSON object. Budgets (DESIGN.md): pair <= 300 ns, launch <= 15 ns,
limited launch <= 30 ns, memory info <= 100 ns, 200 processes <= 2 s. A benchmark, not a test: nothing is asserted.
The driver is hami.testing.isolation_benchmark's, shared with the other vendors' isolation benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation_benchmark import AllocationPair, OverheadBenchmark, load_setup, main

TESTS = Path(__file__).resolve().parents[1] / "vendors" / "nvidia" / "tests" / "isolation"

if __name__ == "__main__":
    benchmark = OverheadBenchmark(
        setup=load_setup(TESTS / "conftest.py"),
        pairs=(AllocationPair("alloc_free_overhead_ns", "alloc", "alloc+free"),),
        baseline="fake driver alone",
    )
    main(benchmark, __doc__)
