"""Leader election among scheduler replicas over a `coordination.k8s.io/v1` Lease, as client-go does it.

Owns who may write: only the leader's filter and bind change the cluster, so two replicas never book the
same device twice. The lease (`kube-system/hami-scheduler` by default) is read and written through the
cluster port; every write carries the resourceVersion it read, so when two replicas race, the API server
takes the first and the other gets `ConflictError`, which only means "someone wrote first": it is not an
error, the loser simply is not the leader this round.

The Lease spec fields are Kubernetes' own: `holderIdentity`, `leaseDurationSeconds`, `acquireTime`,
`renewTime` (RFC 3339 micro time, `2006-01-02T15:04:05.000000Z`) and `leaseTransitions`, so `kubectl get
lease` and client-go based tools read it as usual.

The rules (client-go's `tryAcquireOrRenew`):

- a missing lease is created, held by us;
- a lease held by another replica is left alone until it has not changed for its `leaseDurationSeconds`,
  measured on *our* clock from when we saw it change (the writers' clocks are never compared);
- a lease whose `holderIdentity` is empty (released) may be taken at once;
- taking a lease from another holder (or from nobody) sets `acquireTime` and adds one to
  `leaseTransitions`; renewing our own only moves `renewTime`.

A leader that has not renewed within `renew_deadline` stops leading (`on_stopped_leading`), and `is_leader`
turns false as soon as the deadline passes, even before the step that notices it runs. Because
`renew_deadline < lease_duration`, a replica can only take the lease after the old leader already knows it
lost it: there are never two leaders. `stop()` releases the lease (empty holder, 1 s duration) so a
successor takes over at its next step instead of waiting out the lease.

Each replica's identity is unique per process (`process_identity`: the pod name, or the hostname, plus a
random suffix, as client-go's `hostname_<uuid>`): two replicas that share a name (no `POD_NAME`, the same
hostname, a restarted process reusing its predecessor's name while that one's lease still stands) would
otherwise both read the lease as their own and both lead.

`try_acquire_or_renew()` is one step, driven deterministically by tests with an injected `clock`
(monotonic seconds, for every decision) and `now` (wall time, only for the timestamps written);
`start()` runs steps every `retry_period` on a background thread.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from hami.cluster.port import Cluster, ClusterError, ConflictError, KubeObject, NotFoundError

__all__ = ["LEASE_API_VERSION", "LeaderElector", "format_micro_time", "process_identity"]

log = logging.getLogger(__name__)

LEASE_API_VERSION: Final = "coordination.k8s.io/v1"
JITTER: Final = 0.2
"""Candidates wait `retry_period × (1 + up to JITTER)` between steps, so replicas started together spread out."""

Callback = Callable[[], None]


def format_micro_time(t: datetime) -> str:
    """Kubernetes' MicroTime: `2006-01-02T15:04:05.000000Z`, always UTC."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    t = t.astimezone(UTC)
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}.{t.microsecond:06d}Z"


def _record(lease: KubeObject) -> tuple[Any, ...]:
    """The parts of a lease whose change means its holder is alive (client-go compares the whole record)."""
    spec = lease.get("spec") or {}
    return tuple(
        spec.get(k) for k in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime", "leaseTransitions")
    )


def process_identity(environ: Mapping[str, str] | None = None) -> str:
    """This process's lease identity: `$POD_NAME` (or the hostname) and a random suffix, unique per process."""
    base = (environ if environ is not None else os.environ).get("POD_NAME") or socket.gethostname() or "hami"
    return f"{base}_{uuid.uuid4()}"


class LeaderElector:
    """Elects one leader among the replicas sharing a lease name; see the module docstring for the rules."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        name: str = "hami-scheduler",
        namespace: str = "kube-system",
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_started_leading: Callback | None = None,
        on_stopped_leading: Callback | None = None,
    ) -> None:
        if not identity:
            raise ValueError("a leader elector needs a non-empty identity (e.g. the pod name)")
        if not lease_duration > renew_deadline > retry_period * (1 + JITTER) > 0:
            raise ValueError(
                f"need lease_duration > renew_deadline > retry_period × {1 + JITTER} > 0; got lease_duration="
                f"{lease_duration}, renew_deadline={renew_deadline}, retry_period={retry_period}"
            )
        self.cluster = cluster
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.now = now
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self._step_lock = threading.RLock()  # callbacks may call stop() from a step
        self._leading = False
        self._renewed_at = 0.0
        """`clock()` when the last successful renewal *started* (a conservative start of the lease)."""
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------------- state

    @property
    def is_leader(self) -> bool:
        """True while this replica holds the lease and renewed it within `renew_deadline`."""
        return self._leading and self.clock() - self._renewed_at <= self.renew_deadline

    @property
    def lease_seconds(self) -> int:
        """`leaseDurationSeconds` as written: the duration rounded up to whole seconds."""
        return max(1, math.ceil(self.lease_duration))

    # ---------------------------------------------------------------------------------- one step

    def try_acquire_or_renew(self) -> bool:
        """Acquire or renew the lease once; True when this replica leads afterwards. Never raises ClusterError."""
        with self._step_lock:
            started = self.clock()
            if self._leading and started - self._renewed_at > self.renew_deadline:
                self._step_down(f"could not renew the lease within {self.renew_deadline:g} s")
            try:
                acquired = self._attempt()
            except ConflictError as exc:
                log.debug("lease %s/%s: another replica wrote first (%s)", self.namespace, self.name, exc)
                acquired = False
            except ClusterError as exc:
                log.warning("lease %s/%s: cannot acquire or renew: %s", self.namespace, self.name, exc)
                acquired = False
            if acquired:
                self._renewed_at = started
                if not self._leading:
                    self._leading = True
                    log.info("%s is now the leader (lease %s/%s)", self.identity, self.namespace, self.name)
                    self._call(self.on_started_leading, "on_started_leading")
                return True
            if self._leading and self.clock() - self._renewed_at > self.renew_deadline:
                self._step_down(f"could not renew the lease within {self.renew_deadline:g} s")
            return self.is_leader

    def _attempt(self) -> bool:
        """One read and (maybe) one write; False when the lease is held by another; raises ClusterError."""
        stamp = format_micro_time(self.now())
        try:
            lease = self.cluster.get("leases", self.name, self.namespace)
        except NotFoundError:
            created = self.cluster.create("leases", self._new_lease(stamp))
            self._observe(_record(created))
            return True
        # Observed *after* the read returned: never earlier than the holder's write, so never earlier than
        # the moment its holder measures its own renewal from.
        record = _record(lease)
        if record != self._observed:
            self._observe(record)
        spec = dict(lease.get("spec") or {})
        holder = spec.get("holderIdentity") or ""
        ours = holder == self.identity
        if holder and not ours:
            duration = spec.get("leaseDurationSeconds")
            seconds = float(duration) if isinstance(duration, int | float) and duration > 0 else self.lease_duration
            if self.clock() - self._observed_at <= seconds:
                if self._leading:
                    self._step_down(f"the lease is held by {holder}")
                return False
            log.info("lease %s/%s of %s expired; taking it over", self.namespace, self.name, holder)
        transitions = spec.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) and transitions >= 0 else 0
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.lease_seconds, renewTime=stamp)
        if not ours or not spec.get("acquireTime"):
            spec["acquireTime"] = stamp
        if not ours:
            spec["leaseTransitions"] = transitions + 1
        lease["spec"] = spec
        written = self.cluster.replace("leases", lease)
        self._observe(_record(written))
        return True

    def _new_lease(self, stamp: str) -> KubeObject:
        return {
            "apiVersion": LEASE_API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.lease_seconds,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": 0,
            },
        }

    def _observe(self, record: tuple[Any, ...]) -> None:
        self._observed = record
        self._observed_at = self.clock()

    def _step_down(self, why: str, level: int = logging.WARNING) -> None:
        if not self._leading:
            return
        self._leading = False
        log.log(level, "%s stops leading: %s", self.identity, why)
        self._call(self.on_stopped_leading, "on_stopped_leading")

    def _call(self, callback: Callback | None, what: str) -> None:
        if callback is None:
            return
        try:
            callback()
        except Exception:  # a failing callback must not break the election
            log.exception("leader election callback %s failed", what)

    # ---------------------------------------------------------------------------------- release

    def release(self) -> bool:
        """Give the lease up if we hold it (empty holder, 1 s duration); True when released. Stops leading."""
        with self._step_lock:
            released = False
            for _ in range(5):
                try:
                    lease = self.cluster.get("leases", self.name, self.namespace)
                    spec = dict(lease.get("spec") or {})
                    if spec.get("holderIdentity") != self.identity:
                        break
                    stamp = format_micro_time(self.now())
                    spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=stamp, acquireTime=stamp)
                    lease["spec"] = spec
                    self.cluster.replace("leases", lease)
                    released = True
                    break
                except ConflictError:
                    continue  # written in between: read again, it may no longer be ours
                except NotFoundError:
                    break
                except ClusterError as exc:
                    log.warning("lease %s/%s: cannot release: %s", self.namespace, self.name, exc)
                    break
            self._step_down("released the lease", logging.INFO)
            return released

    # ---------------------------------------------------------------------------------- background

    def start(self) -> LeaderElector:
        """Run steps on a daemon thread: every `retry_period` (with jitter while not leading)."""
        if self._thread is not None and self._thread.is_alive():
            return self
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                leading = self.try_acquire_or_renew()
            except Exception:  # anything unexpected: log it and keep electing
                log.exception("leader election step failed")
                leading = False
            wait = self.retry_period if leading else self.retry_period * (1 + JITTER * random.random())
            self._stopping.wait(wait)

    def stop(self) -> None:
        """Stop the background steps and release the lease, so a successor takes over at its next step."""
        self._stopping.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.release()
