"""The node annotations the scheduler reads: each device kind's register, and the handshake.

For every kind discovery found on this node, the register annotation (`AnnotationKeys.node_register`) holds
its devices: HAMi's JSON array, or the legacy colon string for kinds registered `RegisterFormat.LEGACY`. A
capacity kind (`RegisterFormat.CAPACITY`) that declares a register key gets the JSON form too (the scheduler
reads the annotation before the capacity); one without a key publishes nothing here, its devices reach the
scheduler through the node's capacity. A vendor's `NodeInventory.annotations` are published as they are.

`sync` reads the node, compares, and patches only what differs, so calling it often is cheap; the daemon
calls it when discovery changes something and periodically, which also repairs annotations someone else
removed. The handshake (`AnnotationKeys.node_handshake`): the scheduler writes `Requesting_<time>`; the answer
is the register annotation refreshed together with `Reported_<time>`, written on the first sync and whenever
the handshake holds anything else (a request, or the scheduler's `Deleted_<time>` after it dropped the node).

The lock offer (`hami.io/node-lock-lease`, `hami.cluster.nodelease`): the Lease this daemon reads the node lock
from, written with the register while the Lease is in place and removed when it is not.

Annotations of kinds that were never discovered here are left alone; a kind whose devices all disappeared
publishes an empty register, so the scheduler stops placing pods on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime

from hami.cluster.nodelease import LEASE_ANNOTATION
from hami.cluster.port import Cluster, meta
from hami.codec import Handshake, encode_handshake, encode_legacy_register, encode_node_register
from hami.model import NodeInventory, RegisterFormat
from hami.plugins import VendorPlugins

__all__ = ["NodeRegistrar"]

log = logging.getLogger(__name__)


class NodeRegistrar:
    """Keeps one node's register and handshake annotations in step with discovery."""

    def __init__(
        self,
        cluster: Cluster,
        plugins: VendorPlugins,
        node: str,
        *,
        clock: Callable[[], datetime] = datetime.now,
        lock_lease: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.cluster = cluster
        self.lock_lease = lock_lease
        """The `hami.io/node-lock-lease` value to offer now (the Lease checked in place), None: no offer."""
        self.plugins = plugins
        self.node = node
        self.clock = clock
        self._reported: set[str] = set()
        """Handshake keys answered at least once by this process."""

    def desired(self, inventories: Mapping[str, NodeInventory]) -> dict[str, str]:
        """kind → inventory, to the register annotations (and vendor extras) this node should carry."""
        out: dict[str, str] = {}
        for word, inventory in sorted(inventories.items()):
            kind = self.plugins.kind(word)
            key = kind.annotations.node_register
            if key and not self._own_form(word):
                if kind.register_format == RegisterFormat.LEGACY:
                    out[key] = encode_legacy_register(inventory.devices)
                else:
                    out[key] = encode_node_register(inventory.devices)
            out.update(inventory.annotations)
        return out

    def _own_form(self, word: str) -> bool:
        """The vendor publishes kind `word`'s devices in a form of its own (its `hami_node_devices` reads them:
        it answers, if only ``[]``, for a node without them), so the register key is the vendor's to write."""
        if not self.plugins.implements(word, "hami_node_devices"):
            return False
        return self.plugins.node_devices(word, {}, self.node) is not None

    def sync(self, inventories: Mapping[str, NodeInventory]) -> dict[str, str | None]:
        """Patch the node where it differs from `inventories`, answer handshakes; returns what was written.

        :raises hami.cluster.ClusterError: the node cannot be read or patched.
        """
        obj = self.cluster.get("nodes", self.node)
        current: Mapping[str, str] = meta(obj).get("annotations") or {}
        patch: dict[str, str | None] = {k: v for k, v in self.desired(inventories).items() if current.get(k) != v}
        offer = self.lock_lease()
        if current.get(LEASE_ANNOTATION) != offer:
            patch[LEASE_ANNOTATION] = offer
        reported = encode_handshake(Handshake("Reported", self.clock().replace(microsecond=0)))
        answered = []
        for word in inventories:
            key = self.plugins.kind(word).annotations.node_handshake
            if not key:
                continue
            if key not in self._reported or not str(current.get(key, "")).startswith("Reported"):
                patch[key] = reported
                answered.append(key)
        if patch:
            self.cluster.patch_metadata("nodes", self.node, annotations=patch)
            self._reported.update(answered)
            log.info("node %s: wrote %s", self.node, ", ".join(sorted(patch)))
        return patch
