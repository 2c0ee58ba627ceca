"""Isolation library overhead: what libamvgpu.so adds to HIP calls, and how fast a container's processes start.

    python vendors/amd/benchmarks/isolation.py [--rounds 200000] [--json]

Builds the fake ROCm HIP runtime and the client program of ``vendors/amd/tests/isolation`` with the system C
compiler, then times, in the client (best of 7 rounds, best of 3 processes), each call against the fake runtime
alone and with the installed ``libamvgpu.so`` preloaded: an allocate+free pair (``hipMalloc`` + ``hipFree`` of 1 MiB
under a memory limit), a launch (``hipLaunchKernel``) without and with a compute limit, a memory-info query
(``hipMemGetInfo`` under a memory limit), and 200 processes of one container started at once. Prints one line per
figure and, last, one JSON object. The same driver and figures as NVIDIA's and Ascend's benchmarks
(hami.testing.isolation_benchmark). A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation_benchmark import AllocationPair, OverheadBenchmark, load_setup, main

TESTS = Path(__file__).resolve().parents[1] / "tests" / "isolation"

if __name__ == "__main__":
    benchmark = OverheadBenchmark(
        setup=load_setup(TESTS / "conftest.py"),
        pairs=(AllocationPair("alloc_free_overhead_ns", "alloc", "hipMalloc+hipFree"),),
        baseline="fake HIP runtime alone",
    )
    main(benchmark, __doc__)
