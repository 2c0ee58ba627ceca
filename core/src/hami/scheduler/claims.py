"""DRA claims in the scheduler's accounting: the devices kube-scheduler allocated to ResourceClaims of HAMi's DRA
driver count on their node like a device-plugin pod's placement, so the extender never gives a pod what a
claim holds (the node daemon's plugin checks the other direction, `hami.dra.claims.NodeUsage`).

An allocated claim (`status.allocation.devices.results` of the configured driver) becomes a `PodRecord` keyed
``<namespace>/resourceclaim:<name>`` (no pod name has a colon), one container holding, per device kind, each
allocated device with its consumed ``memory`` and ``cores`` (the whole device when the device does not allow
several allocations), one slot per share. Device names are resolved against the node's devices as this state
knows them, with the names the node daemon publishes them under (`hami.dra.slices.device_name`); a claim
whose devices are not known yet is kept pending and resolved again when its node changes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from hami.cluster.port import KubeObject, meta
from hami.dra.claims import share_of
from hami.dra.slices import device_name, hashed_device_name
from hami.fitting import effective_grants
from hami.model import NO_INIT, ContainerDevice, ContainerPlacement
from hami.scheduler.state import ClusterState, NodeRecord, PodRecord

__all__ = ["ClaimTracker", "claim_key"]

log = logging.getLogger(__name__)


def claim_key(namespace: str, name: str) -> str:
    return f"{namespace}/resourceclaim:{name}"


def _devices_by_name(node: NodeRecord) -> dict[str, tuple[str, ContainerDevice]]:
    """Published device name → (kind, the whole device as a placement entry) for the node's devices."""
    out: dict[str, tuple[str, ContainerDevice]] = {}
    for kind, view in node.views.items():
        for usage in view.devices:
            d = usage.device
            whole = ContainerDevice(uuid=d.id, type=kind, usedmem=d.devmem, usedcores=100)
            out.setdefault(device_name(kind, d), (kind, whole))
            out[hashed_device_name(kind, d)] = (kind, whole)
    return out


class ClaimTracker:
    """Keeps the allocated claims of one DRA driver counted in a `ClusterState`."""

    def __init__(self, state: ClusterState, driver: str) -> None:
        self.state = state
        self.driver = driver
        self.pending: dict[str, KubeObject] = {}
        """Claim key → a claim naming devices its node's state does not know yet."""

    def set_claim(self, claim: KubeObject) -> None:
        m = meta(claim)
        key = claim_key(str(m.get("namespace") or "default"), str(m.get("name")))
        record = self._record(key, claim)
        self.state.set_claim(key, record)

    def remove_claim(self, namespace: str, name: str) -> None:
        key = claim_key(namespace, name)
        self.pending.pop(key, None)
        self.state.set_claim(key, None)

    def node_changed(self, node: str) -> None:
        """Resolve again the pending claims of `node`."""
        for claim in list(self.pending.values()):
            if node in _pools(claim, self.driver):
                self.set_claim(claim)

    def _record(self, key: str, claim: KubeObject) -> PodRecord | None:
        self.pending.pop(key, None)
        allocation = (claim.get("status") or {}).get("allocation")
        if not isinstance(allocation, Mapping):
            return None
        results = [
            r for r in (allocation.get("devices") or {}).get("results") or ()
            if isinstance(r, Mapping) and r.get("driver") == self.driver
        ]  # fmt: skip
        if not results:
            return None
        pools = {str(r.get("pool") or "") for r in results}
        if len(pools) != 1:
            log.warning("claim %s has devices of driver %s in several pools %s; counting none", key, self.driver, pools)
            return None
        node = pools.pop()
        with self.state.lock:
            record = self.state.nodes.get(node)
            known = _devices_by_name(record) if record is not None else {}
        by_kind: dict[str, list[ContainerDevice]] = {}
        for result in results:
            found = known.get(str(result.get("device") or ""))
            if found is None:
                self.pending[key] = claim
                return None
            kind, whole = found
            try:
                device = share_of(result, self.driver, whole)
            except ValueError as exc:
                log.warning("claim %s: %s; counting the whole device", key, exc)
                device = whole
            by_kind.setdefault(kind, []).append(device)
        allocated: dict[str, tuple[ContainerPlacement, ...]] = {k: (tuple(v),) for k, v in by_kind.items()}
        return PodRecord(
            key=key,
            uid=str(meta(claim).get("uid") or ""),
            node=node,
            order=NO_INIT,
            allocation=allocated,
            grants=effective_grants(allocated, NO_INIT),
            decided=True,
        )


def _pools(claim: KubeObject, driver: str) -> set[str]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return {str(r.get("pool")) for r in results if isinstance(r, Mapping) and r.get("driver") == driver}
