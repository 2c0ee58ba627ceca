"""A tenant zeroing its container's accounting file is caught in the process, by what the process holds itself and
by NVML's per-process memory of the processes the node daemon's map names (hami.testing.isolation.TamperTests)."""

from __future__ import annotations

from hami.testing.isolation import TamperTests


class TestTamper(TamperTests):
    pass
