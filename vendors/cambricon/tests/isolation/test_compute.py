"""Compute isolation over the fake CNDrv and CNRT: the limiter keeps a container's share of (fake) device time near
CAMBRICON_DEVICE_CORE_LIMIT whatever the launch API (cnrtInvokeKernel, which reaches cnInvokeKernel underneath and
is admitted once; cnInvokeKernel; cnInvokeKernelEx), timed with CNRT notifiers; and containers share the device in
proportion to their limits. Measured on the fake device's timeline after a warm-up."""

from __future__ import annotations

from functools import partial

import pytest

from hami.testing.isolation import SHARE_MEASUREMENT, device_shares, finish

shares = partial(device_shares, warmup=0.6, window=1.2)

WORKLOADS = {
    "1ms CNRT kernels": ("rt", [32], {"FAKE_MLU_KERNEL_NS": "1000000"}),
    "every launch API, 2.6us to 1.3ms": ("mixed", [132, 8448, 65536, 1024], {"FAKE_MLU_KERNEL_NS_PER_BLOCK": "20"}),
    "CNDrv kernels": ("cn", [48], {"FAKE_MLU_KERNEL_NS": "800000"}),
}


@SHARE_MEASUREMENT
@pytest.mark.parametrize("workload", WORKLOADS)
def test_utilization_settles_near_a_30_percent_limit(sandbox, workload):
    mode, blocks, timing = WORKLOADS[workload]
    proc = sandbox.start("launch", 2.2, mode, *blocks, env=sandbox.env(cores=30, extra=timing))
    (share,) = shares(sandbox, [0])
    finish(proc)
    assert share == pytest.approx(0.30, abs=0.05), f"{workload}: the device was {share:.1%} busy under a 30% limit"
    device = sandbox.account().device(0)
    assert device.core_limit == 30
    assert device.launches > 0


@SHARE_MEASUREMENT
def test_two_containers_share_in_proportion_to_their_limits(sandbox):
    timing = {"FAKE_MLU_KERNEL_NS": "500000"}
    a = sandbox.start("launch", 2.2, "rt", 16, env=sandbox.env("a", cores=20, extra={**timing, "FAKE_MLU_TAG": "0"}))
    b = sandbox.start("launch", 2.2, "rt", 16, env=sandbox.env("b", cores=50, extra={**timing, "FAKE_MLU_TAG": "1"}))
    first, second = shares(sandbox, [0, 1])
    finish(a)
    finish(b)
    assert first == pytest.approx(0.20, abs=0.05)
    assert second == pytest.approx(0.50, abs=0.06)


def test_without_a_limit_launches_run_unthrottled(sandbox):
    out = sandbox.client_json("launch", 0.3, "mixed", 1, env=sandbox.env(extra={"FAKE_MLU_KERNEL_NS": "0"}))
    assert out["launches"] > 1000
