"""Isolation library overhead: what libvmlu.so adds to CNRT calls, and how fast a container's processes start.

    python vendors/cambricon/benchmarks/isolation.py [--rounds 200000] [--json]

Builds the fake CNDrv and CNRT and the client program of ``vendors/cambricon/tests/isolation`` with the system C
compiler, then times, in the client (best of 7 rounds, best of 3 processes), each call against the fake libraries
alone and with the installed ``libvmlu.so`` preloaded: an allocate+free pair (``cnrtMalloc`` + ``cnrtFree`` of 1 MiB
under a memory limit), a launch (``cnrtInvokeKernel``) without and with a compute limit, a memory-info query
(``cnrtMemGetInfo`` under a memory limit), and 200 processes of one container started at once. Prints one line per
figure and, last, one JSON object. The same driver and figures as NVIDIA's, Ascend's and Hygon's benchmarks
(hami.testing.isolation_benchmark). A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation_benchmark import AllocationPair, OverheadBenchmark, load_setup, main

TESTS = Path(__file__).resolve().parents[1] / "tests" / "isolation"

if __name__ == "__main__":
    benchmark = OverheadBenchmark(
        setup=load_setup(TESTS / "conftest.py"),
        pairs=(AllocationPair("alloc_free_overhead_ns", "alloc", "cnrtMalloc+cnrtFree"),),
        baseline="fake CNDrv and CNRT alone",
    )
    main(benchmark, __doc__)
