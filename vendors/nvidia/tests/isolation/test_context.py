"""The driver's per-process context memory counts against the container's limit
(hami.testing.isolation.ContextMemoryTests)."""

from __future__ import annotations

from hami.testing.isolation import ContextMemoryTests


class TestContextMemory(ContextMemoryTests):
    driver_library = "libcuda.so.1"
    out_of_memory = 2  # CUDA_ERROR_OUT_OF_MEMORY
