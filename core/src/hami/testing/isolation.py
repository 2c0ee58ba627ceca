"""What vendors' isolation-library tests share: measuring device-time shares on a fake device, and finishing the
launching clients.

A vendor's test sandbox exposes its fake device's per-tag busy time as `sandbox.device().busy_ns` (a mapping
from the launching container's tag to nanoseconds of device time); the helpers here read it the same way for every
vendor. Share measurements are marked `SHARE_MEASUREMENT`: on a 2-core host shared with the fake device's own
threads, a run in which the host starves one container for a moment measures the host, not the limiter, so such a
run is repeated (at most 4 times, with pytest-rerunfailures); a limiter that is wrong fails all five.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import pytest

__all__ = ["SHARE_MEASUREMENT", "device_shares", "finish"]

SHARE_MEASUREMENT = pytest.mark.flaky(reruns=4)


class _FakeDevice(Protocol):
    @property
    def busy_ns(self) -> Mapping[int, int]: ...


class _Sandbox(Protocol):
    def device(self) -> _FakeDevice: ...


def device_shares(sandbox: _Sandbox, tags: Sequence[int], warmup: float = 0.8, window: float = 2.0) -> list[float]:
    """Fraction of wall time the device spent on each tag's work during `window`, after `warmup` seconds."""
    time.sleep(warmup)
    before, t0 = sandbox.device().busy_ns, time.monotonic()
    time.sleep(window)
    after, t1 = sandbox.device().busy_ns, time.monotonic()
    return [(after[tag] - before[tag]) / ((t1 - t0) * 1e9) for tag in tags]


def finish(proc: subprocess.Popen[str]) -> Any:
    """Wait for a launching client; its last stdout line, a JSON object. Fails the test if the client failed."""
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, f"the launching client failed:\n{out}\n{err}"
    return json.loads(out.strip().splitlines()[-1])
