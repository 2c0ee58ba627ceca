"""Leader election over a Lease on the in-memory cluster, driven step by step on an injected clock."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hami.cluster import ClusterError, KubeObject, MemoryCluster, Resource
from hami.scheduler.leader import LeaderElector, format_micro_time

MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
EPOCH = datetime(2025, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)


class Clock:
    """Monotonic seconds that move only when a test says so; `wall` is the matching wall time."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    def wall(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t - 1000.0)


class Calls:
    def __init__(self) -> None:
        self.log: list[str] = []

    def started(self, who: str) -> Callable[[], None]:
        return lambda: self.log.append(f"{who} started")

    def stopped(self, who: str) -> Callable[[], None]:
        return lambda: self.log.append(f"{who} stopped")


def elector(cluster: Any, clock: Clock, identity: str, calls: Calls | None = None, **kw: Any) -> LeaderElector:
    return LeaderElector(
        cluster,
        identity=identity,
        clock=clock,
        now=clock.wall,
        on_started_leading=calls.started(identity) if calls else None,
        on_stopped_leading=calls.stopped(identity) if calls else None,
        **kw,
    )


def lease(cluster: MemoryCluster) -> dict[str, Any]:
    obj = cluster.get("leases", "hami-scheduler", "kube-system")
    spec: dict[str, Any] = obj["spec"]
    return spec


def test_micro_time_is_kubernetes_format() -> None:
    assert format_micro_time(datetime(2006, 1, 2, 15, 4, 5, tzinfo=UTC)) == "2006-01-02T15:04:05.000000Z"
    assert format_micro_time(datetime(2006, 1, 2, 15, 4, 5, 7)) == "2006-01-02T15:04:05.000007Z"
    east = datetime(2006, 1, 2, 19, 4, 5, 120000, tzinfo=timezone(timedelta(hours=2)))
    assert format_micro_time(east) == "2006-01-02T17:04:05.120000Z"


def test_timings_must_leave_room_for_renewal() -> None:
    cluster = MemoryCluster()
    with pytest.raises(ValueError, match="lease_duration > renew_deadline"):
        LeaderElector(cluster, identity="a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(cluster, identity="a", lease_duration=15, renew_deadline=2, retry_period=2)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(cluster, identity="")


def test_one_of_two_leads_and_the_lease_says_so() -> None:
    cluster, clock, calls = MemoryCluster(), Clock(), Calls()
    a, b = elector(cluster, clock, "a", calls), elector(cluster, clock, "b", calls)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    assert (a.is_leader, b.is_leader) == (True, False)
    assert calls.log == ["a started"]
    obj = cluster.get("leases", "hami-scheduler", "kube-system")
    assert (obj["apiVersion"], obj["kind"]) == ("coordination.k8s.io/v1", "Lease")
    spec = obj["spec"]
    assert spec == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 15,
        "acquireTime": "2025-03-04T05:06:07.123456Z",
        "renewTime": "2025-03-04T05:06:07.123456Z",
        "leaseTransitions": 0,
    }
    clock.advance(2)
    assert a.try_acquire_or_renew() is True
    renewed = lease(cluster)
    assert renewed["renewTime"] == "2025-03-04T05:06:09.123456Z"
    assert MICRO_TIME.match(renewed["renewTime"])
    assert (renewed["acquireTime"], renewed["leaseTransitions"]) == (spec["acquireTime"], 0)


def test_the_other_takes_over_after_the_lease_expires() -> None:
    cluster, clock, calls = MemoryCluster(), Clock(), Calls()
    a, b = elector(cluster, clock, "a", calls), elector(cluster, clock, "b", calls)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b sees the lease now: it expires 15 s from here on b's clock
    clock.advance(10)
    assert a.is_leader  # exactly at the renew deadline: still leading
    assert not b.try_acquire_or_renew()
    clock.advance(0.5)
    assert not a.is_leader  # past its renew deadline: a knows it lost before anyone may take over
    clock.advance(4.5)
    assert not b.try_acquire_or_renew()  # 15 s: not yet expired
    clock.advance(0.1)
    assert b.try_acquire_or_renew()
    spec = lease(cluster)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("b", 1)
    assert spec["acquireTime"] == spec["renewTime"] == format_micro_time(clock.wall())
    assert calls.log == ["a started", "b started"]
    assert not a.try_acquire_or_renew()  # a notices, and says so once
    assert calls.log == ["a started", "b started", "a stopped"]
    assert (a.is_leader, b.is_leader) == (False, True)
    # and back: b stops renewing, a takes over, the count goes on
    assert not a.try_acquire_or_renew()
    clock.advance(15.1)
    assert a.try_acquire_or_renew()
    assert (lease(cluster)["holderIdentity"], lease(cluster)["leaseTransitions"]) == ("a", 2)


def test_a_lease_that_keeps_changing_never_expires() -> None:
    cluster, clock = MemoryCluster(), Clock()
    a, b = elector(cluster, clock, "a"), elector(cluster, clock, "b")
    for _ in range(100):
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
        clock.advance(2)
    assert lease(cluster)["leaseTransitions"] == 0


def test_stop_hands_the_lease_over_at_once() -> None:
    cluster, clock, calls = MemoryCluster(), Clock(), Calls()
    a, b = elector(cluster, clock, "a", calls), elector(cluster, clock, "b", calls)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    a.stop()
    assert not a.is_leader
    spec = lease(cluster)
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("", 1, 0)
    assert b.try_acquire_or_renew()  # no time has passed
    assert (lease(cluster)["holderIdentity"], lease(cluster)["leaseTransitions"]) == ("b", 1)
    assert calls.log == ["a started", "a stopped", "b started"]
    b.stop()
    a.stop()  # stopping a replica that does not lead leaves the lease alone
    assert lease(cluster)["holderIdentity"] == ""


def test_stop_without_a_lease_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        elector(MemoryCluster(), Clock(), "a").stop()
    assert caplog.records == []


class Flaky:
    """A cluster whose lease writes fail (API unreachable) or lose a race while `mode` says so."""

    def __init__(self, inner: MemoryCluster) -> None:
        self.inner = inner
        self.mode = ""
        self.before_write: Callable[[], object] | None = None

    def get(self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False) -> KubeObject:
        return self.inner.get(resource, name, namespace)

    def create(self, resource: Resource, obj: KubeObject) -> KubeObject:
        return self.inner.create(resource, obj)

    def replace(self, resource: Resource, obj: KubeObject) -> KubeObject:
        if self.mode == "down":
            raise ClusterError("connection refused", 0)
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()
        return self.inner.replace(resource, obj)


def test_a_leader_that_cannot_renew_steps_down_after_the_deadline() -> None:
    memory, clock, calls = MemoryCluster(), Clock(), Calls()
    flaky = Flaky(memory)
    a = elector(flaky, clock, "a", calls)
    assert a.try_acquire_or_renew()
    flaky.mode = "down"
    for _ in range(5):  # 2, 4, 6, 8, 10 s: renewals fail, but a still leads within its deadline
        clock.advance(2)
        assert a.try_acquire_or_renew()
    assert calls.log == ["a started"]
    clock.advance(0.5)
    assert not a.is_leader
    assert not a.try_acquire_or_renew()
    assert calls.log == ["a started", "a stopped"]
    flaky.mode = ""  # the API is back and nobody took the lease: a leads again, with no transition
    assert a.try_acquire_or_renew()
    assert calls.log == ["a started", "a stopped", "a started"]
    assert lease(memory)["leaseTransitions"] == 0


def test_a_conflict_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    memory, clock, calls = MemoryCluster(), Clock(), Calls()
    flaky = Flaky(memory)
    a, b = elector(memory, clock, "a", calls), elector(flaky, clock, "b", calls)
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()
    clock.advance(16)  # a stalled: its lease looks expired to b
    flaky.before_write = lambda: a.try_acquire_or_renew()  # ... but a renews between b's read and b's write
    with caplog.at_level(logging.WARNING):
        assert b.try_acquire_or_renew() is False
    assert [r for r in caplog.records if r.name == "hami.scheduler.leader" and "cannot" in r.getMessage()] == []
    assert (a.is_leader, b.is_leader) == (True, False)
    assert lease(memory)["holderIdentity"] == "a"
    # a stepped down when it found itself past its deadline, then took its own lease back
    assert calls.log == ["a started", "a stopped", "a started"]


def test_losing_the_race_to_create_the_lease_is_not_an_error(caplog: pytest.LogCaptureFixture) -> None:
    memory, clock = MemoryCluster(), Clock()
    d = elector(memory, clock, "d")

    class LateReader(Flaky):
        def get(
            self, resource: Resource, name: str, namespace: str | None = None, *, recent: bool = False
        ) -> KubeObject:
            try:
                return self.inner.get(resource, name, namespace)
            finally:  # c reads "not found"; d creates the lease before c's create arrives
                d.try_acquire_or_renew()

    c = elector(LateReader(memory), clock, "c")
    with caplog.at_level(logging.WARNING):
        assert c.try_acquire_or_renew() is False
    assert [r for r in caplog.records if r.name == "hami.scheduler.leader"] == []
    assert (c.is_leader, d.is_leader) == (False, True)
    assert lease(memory)["holderIdentity"] == "d"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sets(st.sampled_from([0, 1, 2])), st.sampled_from([0.0, 0.5, 2.0, 5.0, 9.9, 10.5, 15.5, 40.0])),
        min_size=1,
        max_size=25,
    )
)
def test_concurrent_electors_never_make_two_leaders(rounds: list[tuple[set[int], float]]) -> None:
    """Electors step at the same instant on threads; some stall for rounds, so leases expire and move."""
    cluster, clock = MemoryCluster(), Clock()
    electors = [elector(cluster, clock, f"e{i}") for i in range(3)]
    transitions = 0
    for participants, advance in rounds:
        clock.advance(advance)
        stepping = [electors[i] for i in sorted(participants)]
        barrier = threading.Barrier(len(stepping)) if stepping else None
        errors: list[BaseException] = []

        def step(e: LeaderElector, barrier: threading.Barrier | None = barrier, errors: list[Any] = errors) -> None:
            try:
                assert barrier is not None
                barrier.wait(timeout=30)
                e.try_acquire_or_renew()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=step, args=(e,)) for e in stepping]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        leaders = [e.identity for e in electors if e.is_leader]
        assert len(leaders) <= 1, leaders
        if leaders:
            assert lease(cluster)["holderIdentity"] == leaders[0]
        if len(participants) == 3:
            assert len(leaders) == 1  # when everyone steps, someone leads
        if stepping:
            now = lease(cluster)["leaseTransitions"]
            assert now >= transitions
            transitions = now


def test_background_threads_elect_and_hand_over_on_stop() -> None:
    cluster = MemoryCluster()
    events = {name: (threading.Event(), threading.Event()) for name in ("a", "b")}

    def make(name: str) -> LeaderElector:
        started, stopped = events[name]
        return LeaderElector(
            cluster,
            identity=name,
            lease_duration=30,
            renew_deadline=20,
            retry_period=0.05,
            on_started_leading=started.set,
            on_stopped_leading=stopped.set,
        )

    a = make("a").start()
    assert events["a"][0].wait(10)
    b = make("b").start()
    try:
        assert a.is_leader
        assert not b.is_leader
        a.stop()  # released: b takes over at its next step, long before the 30 s lease would run out
        assert events["a"][1].is_set()
        assert events["b"][0].wait(10)
        assert b.is_leader
        assert lease(cluster)["leaseTransitions"] == 1
    finally:
        a.stop()
        b.stop()
    assert lease(cluster)["holderIdentity"] == ""


def test_two_replicas_with_the_same_hostname_and_no_pod_name_never_both_lead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two scheduler replicas start where POD_NAME is not set and the hostname is the same (host networking, a
    copied manifest): each must still be a different lease holder, so that exactly one leads."""
    from hami.config import LeaderElectionConfig
    from hami.plugins import VendorPlugins
    from hami.scheduler.service import SchedulerService

    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.setattr("socket.gethostname", lambda: "same-host")
    cluster = MemoryCluster()
    plugins = VendorPlugins.load(disabled=())
    config = LeaderElectionConfig(enabled=True)
    replicas = [SchedulerService(cluster, plugins, leader_election=config) for _ in range(2)]
    identities = [r.identity for r in replicas]
    assert identities[0] != identities[1]
    assert all(i.startswith("same-host_") for i in identities)
    for _ in range(3):
        for replica in replicas:
            assert replica.elector is not None
            replica.elector.try_acquire_or_renew()
        assert [r.elector.is_leader for r in replicas if r.elector is not None].count(True) == 1
    assert lease(cluster)["holderIdentity"] in identities
