"""Vendor node locks (`DeviceKind.node_lock`) taken with the scheduler's own lock, as HAMi's scheduler takes them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from hami.cluster import MemoryCluster, meta
from hami.cluster.locks import LOCK_ANNOTATION, NodeLocks, VendorLockBusy

VENDOR = "example.com/vendor.lock"
NOW = datetime(2026, 12, 2, 1, 0, 0, tzinfo=UTC)
LOCKS = [(VENDOR, timedelta(minutes=2))]


def setup(annotations: dict[str, str] | None = None) -> tuple[MemoryCluster, NodeLocks]:
    cluster = MemoryCluster()
    cluster.create("nodes", {"metadata": {"name": "n", "annotations": annotations or {}}})
    return cluster, NodeLocks(cluster, clock=lambda: NOW, wait_for_node=lambda node, seconds: None)


def node_annotations(cluster: MemoryCluster) -> dict[str, str]:
    return dict(meta(cluster.get("nodes", "n")).get("annotations") or {})


def test_the_vendor_lock_is_taken_with_the_mutex_and_released_with_it() -> None:
    cluster, locks = setup()
    locks.acquire("n", "default", "p", "uid-p", vendor_locks=LOCKS)
    got = node_annotations(cluster)
    assert got[VENDOR] == "2026-12-02T01:00:00Z"  # RFC 3339, as HAMi's scheduler writes it
    assert got[LOCK_ANNOTATION].split(",")[1:] == ["default", "p"]
    assert locks.release("n", "default", "p", LOCKS)
    assert VENDOR not in node_annotations(cluster)
    assert LOCK_ANNOTATION not in node_annotations(cluster)


@pytest.mark.parametrize("written", ["2026-12-02T00:59:00Z", "2026-12-02T08:59:30+08:00"])
def test_a_fresh_vendor_lock_of_another_scheduler_is_waited_for(written: str) -> None:
    cluster, locks = setup({VENDOR: written})
    with pytest.raises(VendorLockBusy, match=f"node n is locked by {VENDOR} since"):
        locks.acquire("n", "default", "p", "uid-p", wait=0.01, vendor_locks=LOCKS)
    assert LOCK_ANNOTATION not in node_annotations(cluster)
    locks.acquire("n", "default", "q", "uid-q", wait=0.01)  # a pod without that vendor's devices is not held up


@pytest.mark.parametrize("written", ["2026-12-02T00:57:59Z", "not a time"])
def test_an_expired_or_malformed_vendor_lock_is_taken_over(written: str) -> None:
    cluster, locks = setup({VENDOR: written})
    locks.acquire("n", "default", "p", "uid-p", wait=0.01, vendor_locks=LOCKS)
    assert node_annotations(cluster)[VENDOR] == "2026-12-02T01:00:00Z"


def test_a_retried_bind_of_the_same_pod_takes_its_own_vendor_lock_again() -> None:
    cluster, locks = setup()
    locks.acquire("n", "default", "p", "uid-p", vendor_locks=LOCKS)
    locks.acquire("n", "default", "p", "uid-p", wait=0.01, vendor_locks=LOCKS)
    assert node_annotations(cluster)[VENDOR] == "2026-12-02T01:00:00Z"


def test_release_takes_only_the_vendor_lock_written_with_the_mutex() -> None:
    cluster, locks = setup()
    locks.acquire("n", "default", "p", "uid-p", vendor_locks=LOCKS)
    # a release that knows of every vendor's lock (the node side's failure path, the scheduler's clean-up) drops ours
    assert locks.release("n", "default", "p", [*LOCKS, ("example.com/other.lock", timedelta(minutes=2))])
    assert VENDOR not in node_annotations(cluster)
    # another scheduler's vendor lock, taken later than our mutex, is not ours to drop
    locks.acquire("n", "default", "p", "uid-p")
    cluster.patch_metadata("nodes", "n", annotations={VENDOR: "2026-12-02T01:00:05Z"})
    assert locks.release("n", "default", "p", LOCKS)
    assert node_annotations(cluster) == {VENDOR: "2026-12-02T01:00:05Z"}
