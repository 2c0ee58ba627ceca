"""Isolation library overhead: what libvcorex.so adds to CoreX driver calls, and how fast a container's processes start.

    python vendors/iluvatar/benchmarks/isolation.py [--rounds 200000] [--json]

Builds the fake CoreX driver (hami.testing.cuda's fake CUDA-compatible driver at CoreX's CUDA 10.2 level) and the
client program of ``vendors/iluvatar/tests/isolation`` with the system C compiler, then times, in the client (best
of 7 rounds, best of 3 processes), each call against the fake driver alone and with the installed ``libvcorex.so``
preloaded: an allocate+free pair (``cuMemAlloc_v2`` + ``cuMemFree_v2`` of 1 MiB under a memory limit), a launch
(``cuLaunchKernel``) without and with a compute limit, a memory-info query (``cuMemGetInfo_v2`` under a memory
limit), and 200 processes of one container started at once. Prints one line per figure and, last, one JSON object.
The same driver and figures as NVIDIA's benchmark (hami.testing.isolation_benchmark), over the same hook layer. A
benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

from pathlib import Path

from hami.testing.isolation_benchmark import AllocationPair, OverheadBenchmark, load_setup, main

TESTS = Path(__file__).resolve().parents[1] / "tests" / "isolation"

if __name__ == "__main__":
    benchmark = OverheadBenchmark(
        setup=load_setup(TESTS / "conftest.py"),
        pairs=(AllocationPair("alloc_free_overhead_ns", "alloc", "cuMemAlloc_v2+cuMemFree_v2"),),
        baseline="fake CoreX driver alone",
    )
    main(benchmark, __doc__)
