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
not a test: nothing is asserted. The driver is hami.testing.isolation_benchmark's, shared with the other vendors'
isolation benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation_benchmark import AllocationPair, OverheadBenchmark, load_setup, main

TESTS = Path(__file__).resolve().parents[1] / "tests" / "isolation"

if __name__ == "__main__":
    benchmark = OverheadBenchmark(
        setup=load_setup(TESTS / "conftest.py"),
        pairs=(
            AllocationPair("alloc_free_overhead_ns", "alloc", "rtMalloc+rtFree"),
            AllocationPair("acl_alloc_free_overhead_ns", "aclalloc", "aclrtMalloc+aclrtFree"),
        ),
        baseline="fake stack alone",
    )
    main(benchmark, __doc__)
