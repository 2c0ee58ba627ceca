"""Allocate survives the daemon's death at every step: the kubelet's retry gets the same answer.

Each case runs on a node locked HAMi's way (the `hami.io/mutex.lock` annotation) and on one locked through the
Lease the daemon offers (`hami.cluster.nodelease`).

The real daemon process (`python -m hami.node`) serves the fake kubelet against the fake API server. The
API server SIGKILLs the daemon when Allocate's n-th request arrives, either before carrying it out (the
daemon died before that write landed) or after (it landed, and the daemon died before the next step, at the
last step before the kubelet had its answer). A new daemon process starts on the same host directories, the
kubelet calls Allocate again with the same device IDs, and must get exactly the answer an undisturbed
Allocate gives, with the pod left allocated and the node unlocked.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fake_apiserver import FakeApiServer
from node_harness import (
    NODE,
    DaemonProcess,
    build_library,
    dev,
    free_port,
    install_scripted_vendor,
    node_annotations,
    place_pod,
    pod_annotations,
    scripted_devices,
    write_script,
)

from hami.cluster import MemoryCluster, meta
from hami.cluster.locks import LOCK_ANNOTATION, NodeLocks
from hami.cluster.nodelease import LEASE_ANNOTATION, LEASE_PREFIX, holder_of
from hami.cluster.port import NotFoundError
from hami.model import ContainerEdits
from hami.scheduler.extender import BIND_PHASE
from hami.testing.apiserver import ApiRequest, Override
from hami.testing.kubelet import FakeKubelet, PluginCallError

RESOURCE = "scripted.example/accel"
TO_ALLOCATE = "hami.io/scripted-devices-to-allocate"
DEVICE_IDS = ["SCR-1-0"]
STEPS = {"annotation": 5, "lease": 3}
"""Allocate's requests. With HAMi's annotation lock: get the node (its lock), get the lock's owner, patch the pod's
entries with bind-phase success (after the journal is written), get the node and patch it (the lock's release).
With the daemon's lock Lease (`hami.cluster.nodelease`): get the Lease (its holder), get the holder, patch the pod,
which is also the lock's release."""
CASES = [(lock, step) for lock, steps in STEPS.items() for step in range(steps)]


class KillingApiServer(FakeApiServer):
    """Kills the daemon at the n-th request once armed: before carrying it out, or after."""

    def __init__(self) -> None:
        super().__init__()
        self.daemon: DaemonProcess | None = None
        self.armed: tuple[int, bool] | None = None
        self.seen: list[str] = []
        self.last_request = time.monotonic()

    def quiet(self, seconds: float = 0.5, timeout: float = 15) -> None:
        """Wait until no request but watches came for `seconds` (the daemon's start-up writes are done)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() - self.last_request < seconds:
            assert time.monotonic() < deadline, "the daemon never stopped calling the API server"
            time.sleep(0.05)

    def arm(self, step: int, after: bool) -> None:
        with self._lock:
            self.seen = []
            self.armed = (step, after)

    def intercept(self, request: ApiRequest) -> Override | None:
        with self._lock:
            armed = self.armed
            kill = False
            if not request.watch:
                self.last_request = time.monotonic()
            if armed is not None and not request.watch:
                self.seen.append(f"{request.method} {request.path}")
                kill = len(self.seen) - 1 == armed[0]
                if kill:
                    self.armed = None
        if not kill:
            return super().intercept(request)
        assert armed is not None
        assert self.daemon is not None
        os.kill(self.daemon.pid, signal.SIGKILL)
        self.daemon.process.wait(10)
        return Override(0, after=armed[1])


@dataclass
class World:
    api: KillingApiServer
    kubelet: FakeKubelet
    args: list[str]
    site: Path
    tmp: Path
    lock: str
    """How the scheduler locks the node: "annotation" (HAMi's), or "lease" (the Lease the daemon offers)."""
    daemons: list[DaemonProcess] = field(default_factory=list)

    def start_daemon(self) -> DaemonProcess:
        before = len([r for r in self.kubelet.registrations if r.resource == RESOURCE])
        env = {"POD_NAMESPACE": "hami-system"} if self.lock == "lease" else {"POD_NAMESPACE": ""}
        daemon = DaemonProcess(self.args, self.site, self.tmp / f"daemon-{len(self.daemons)}.log", env=env)
        self.daemons.append(daemon)
        self.api.daemon = daemon
        deadline = time.monotonic() + 30
        while len([r for r in self.kubelet.registrations if r.resource == RESOURCE]) <= before:
            assert time.monotonic() < deadline, "daemon did not register:\n" + daemon.log()[-3000:]
            time.sleep(0.05)
        self.kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8, timeout=30)
        if self.lock == "lease":
            deadline = time.monotonic() + 30
            while LEASE_ANNOTATION not in node_annotations(self.api.cluster, NODE):
                assert time.monotonic() < deadline, "the daemon did not offer its Lease:\n" + daemon.log()[-3000:]
                time.sleep(0.05)
        return daemon

    def place(self, name: str) -> None:
        """A pod as the scheduler's bind leaves it, the node locked as `lock` says."""
        leased = self.lock == "lease"
        obj = place_pod(
            self.api.cluster, NODE, name, {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]}, lock=not leased
        )
        if leased:
            NodeLocks(self.api.cluster, holder_done=lambda lock, node: True).acquire(
                NODE, "default", name, meta(obj)["uid"]
            )

    def unlocked(self) -> bool:
        """No lock held for a pod that still allocates: no annotation lock, and a Lease's holder is allocated."""
        if LOCK_ANNOTATION in node_annotations(self.api.cluster, NODE):
            return False
        if self.lock == "annotation":
            return True
        held = holder_of(self.api.cluster.get("leases", LEASE_PREFIX + NODE, "hami-system"))
        try:
            return held is None or pod_annotations(self.api.cluster, held.name)[BIND_PHASE] == "success"
        except NotFoundError:
            return True  # its holder is gone

    def allocate(self) -> ContainerEdits:
        """The kubelet's Allocate for one container, retried while the plugin's socket is not answering yet."""
        deadline = time.monotonic() + 20
        while True:
            try:
                return self.kubelet.start_container(RESOURCE, 1, device_ids=DEVICE_IDS)
            except PluginCallError as exc:
                if exc.code != "UNAVAILABLE" or time.monotonic() > deadline:
                    raise


@pytest.fixture(scope="module", params=list(STEPS))
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("allocate-crash")
    site = install_scripted_vendor(tmp / "site", build_library(tmp / "build"))
    script = write_script(tmp / "script.json", {"Scripted": scripted_devices(2)})
    config = tmp / "hami.yaml"
    config.write_text(json.dumps({"vendors": {"scripted": {"script": str(script)}}}))
    api = KillingApiServer().start()
    api.cluster.create("nodes", {"metadata": {"name": NODE}})
    kubelet = FakeKubelet().start()
    args = ["--config", str(config), "--kubeconfig", str(api.write_kubeconfig(tmp / "kubeconfig"))]
    args += ["--node-name", NODE, "--device-plugin-dir", str(kubelet.directory), "--hook-dir", str(tmp / "hooks")]
    # No background API traffic during an Allocate: discovery and node work only at start-up.
    args += ["--metrics-listen", f"127.0.0.1:{free_port()}", "--discovery-interval", "3600"]
    args += ["--register-interval", "3600"]
    w = World(api, kubelet, args, site, tmp, request.param)
    w.start_daemon()
    try:
        yield w
    finally:
        for daemon in w.daemons:
            daemon.kill()
        kubelet.stop()
        api.stop()


def _undisturbed(world: World) -> tuple[ContainerEdits, list[str]]:
    world.place("reference")
    world.api.quiet()  # under load the start-up's node writes can still be under way, and make the lock retry
    world.api.arm(10_000, False)  # records the requests, kills nobody
    edits = world.allocate()
    steps = list(world.api.seen)
    world.api.armed = None
    world.api.cluster.delete("pods", "reference", "default")
    return edits, steps


@pytest.fixture(scope="module")
def reference(world: World) -> tuple[ContainerEdits, list[str]]:
    return _undisturbed(world)


def _comparable(edits: ContainerEdits) -> dict[str, object]:
    """The answer without what names the pod itself (its accounting file lives under its own UID)."""
    return {
        "env": dict(edits.env),
        "devices": edits.devices,
        "cdi": edits.cdi_devices,
        "mounts": [m.container_path for m in edits.mounts],
    }


def test_the_undisturbed_allocate_makes_the_requests_the_crash_cases_cut(
    world: World, reference: tuple[ContainerEdits, list[str]]
) -> None:
    edits, steps = reference
    assert edits.env["SCRIPTED_VISIBLE_DEVICES"] == "SCR-1"
    assert any(s.startswith("PATCH") and "/pods/" in s for s in steps), steps
    assert len(steps) == STEPS[world.lock], steps  # the parametrisation below covers every step
    assert not [s for s in steps if s.startswith("PATCH") and "/nodes/" in s] or world.lock == "annotation"


@pytest.mark.parametrize("after", [False, True], ids=["before-the-request", "after-the-request"])
@pytest.mark.parametrize(("world", "step"), CASES, indirect=["world"])
def test_a_daemon_killed_during_allocate_answers_the_retry_the_same(
    world: World, reference: tuple[ContainerEdits, list[str]], step: int, after: bool
) -> None:
    """The kubelet's Allocate is cut by the daemon's death at `step`; after the restart, the same call again."""
    expected, _ = reference
    name = f"crash-{step}-{'after' if after else 'before'}"
    cluster = world.api.cluster
    world.place(name)
    world.api.quiet()  # the restarted daemon's start-up writes are done: the step cut is the one named
    world.api.arm(step, after)
    with pytest.raises(PluginCallError):
        world.kubelet.start_container(RESOURCE, 1, device_ids=DEVICE_IDS)
    assert world.api.armed is None, f"the daemon was not killed at step {step}: {world.api.seen}"
    world.start_daemon()
    retried = world.allocate()
    assert _comparable(retried) == _comparable(expected)
    got = pod_annotations(cluster, name)
    assert (got[TO_ALLOCATE], got[BIND_PHASE]) == (";", "success")
    assert world.unlocked()
    cluster.delete("pods", name, "default")


def test_a_second_pod_finding_nothing_to_allocate_is_not_given_the_journaled_answer(
    start_daemon: Callable[..., object], kubelet: FakeKubelet, cluster: MemoryCluster
) -> None:
    """The tenant starts a pod with the device resource but no placement right after another pod was served on
    the node, hoping that its Allocate is taken for the other pod's retry: the kubelet gives it other device IDs,
    and it is refused."""
    start_daemon()
    kubelet.wait_for_devices(RESOURCE, lambda ds: len(ds) == 8)
    place_pod(cluster, NODE, "served", {"Scripted": [[dev("SCR-1", mem=3000, cores=30)]]})
    first = kubelet.start_container(RESOURCE, 1, device_ids=DEVICE_IDS)
    with pytest.raises(PluginCallError, match="no pod is waiting"):
        kubelet.start_container(RESOURCE, 1, device_ids=["SCR-0-0"])
    assert kubelet.start_container(RESOURCE, 1, device_ids=DEVICE_IDS) == first  # the served pod's own retry
