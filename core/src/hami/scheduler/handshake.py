"""The scheduler's half of HAMi's node handshake: nodes whose daemon stops answering lose their devices.

Owns the periodic round (only on the leader): for every node and device kind with a handshake annotation, a
`Reported_<time>` answer is turned into a new `Requesting_<time>` question; a question left unanswered longer
than the timeout becomes `Deleted_<time>`, and `ClusterState` then counts none of that kind's devices on the
node (so no pod is placed on a node whose daemon is gone) until the daemon answers with `Reported_<time>`
again. The node side's half is `hami.node.register`. Times are local wall-clock seconds, as HAMi writes them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from hami.cluster.port import Cluster, ClusterError, ConflictError, NotFoundError
from hami.codec import AnnotationError, Handshake, decode_handshake, encode_handshake
from hami.plugins import VendorHost
from hami.scheduler.state import ClusterState

__all__ = ["HandshakeKeeper"]

log = logging.getLogger(__name__)


class HandshakeKeeper:
    """Asks every node's daemon to confirm it is alive, and drops the devices of the ones that do not."""

    def __init__(
        self,
        cluster: Cluster,
        host: VendorHost,
        state: ClusterState,
        *,
        interval: float = 30.0,
        timeout: timedelta = timedelta(seconds=60),
        is_leader: Callable[[], bool] = lambda: True,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.cluster = cluster
        self.keys = sorted({k.annotations.node_handshake for k in host.kinds if k.annotations.node_handshake})
        self.state = state
        self.interval = interval
        self.timeout = timeout
        self.is_leader = is_leader
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> HandshakeKeeper:
        if self.interval > 0 and self.keys:
            self._thread = threading.Thread(target=self._run, name="handshake", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            if self.is_leader():
                self.round()

    def round(self) -> dict[str, str]:
        """One pass over the nodes; returns node → what was written (for logs and tests)."""
        now = self.clock().replace(microsecond=0)
        with self.state.lock:
            nodes = [(name, dict(record.annotations)) for name, record in self.state.nodes.items()]
        written: dict[str, str] = {}
        for name, current in nodes:
            changes: dict[str, str | None] = {}
            for key in self.keys:
                value = current.get(key)
                if not value:
                    continue
                try:
                    handshake = decode_handshake(value, key)
                except AnnotationError as exc:
                    log.warning("node %s: %s; asking again", name, exc)
                    handshake = Handshake("Reported", now)
                if handshake.state == "Reported":
                    changes[key] = encode_handshake(Handshake("Requesting", now))
                elif handshake.state == "Requesting" and now - handshake.time > self.timeout:
                    log.warning("node %s: its daemon has not answered since %s; its devices are dropped", name,
                                handshake.time)  # fmt: skip
                    changes[key] = encode_handshake(Handshake("Deleted", now))
            if not changes:
                continue
            try:
                self.cluster.patch_metadata("nodes", name, annotations=changes)
            except (ConflictError, NotFoundError):
                continue
            except ClusterError as exc:
                log.warning("node %s: handshake not written: %s", name, exc)
                continue
            written[name] = ", ".join(v.split("_", 1)[0] for v in changes.values() if v)
        return written
