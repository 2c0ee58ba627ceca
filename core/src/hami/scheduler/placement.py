"""The placement writer: a filter's decision written onto its pod, or taken back from it.

A decision is written as one patch of the pod's metadata: the `hami.io/vgpu-node` annotation and label, the
decision time, each kind's `…-to-allocate` and `…-allocated` annotations, the vendors' own pod annotations (the
chosen node's fits carry them), and with placement keys (`hami.signing`) the signature over what the node side
will trust. Without `record_at_bind` the filter writes it before it answers (`record`, which undoes the filter's
steps when the write fails); with it the bind does, adding the bind phase to the same patch
(`hami.scheduler.binding`). A placement abandoned after it was written is removed again (`withdraw`).

Owns these writes and nothing of the decision itself: which node, which devices and what is counted belong to
the filter (`hami.scheduler.extender`) and the state (`hami.scheduler.state`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from hami.cluster.port import Cluster, ClusterError, meta
from hami.codec import encode_pod_devices
from hami.model import Pod
from hami.plugins import VendorPlugins
from hami.scheduler.state import VGPU_NODE_ANNOTATION, ClusterState, Decision
from hami.signing import SIGNATURE_ANNOTATION, SignedPlacement
from hami.transaction import Transaction

__all__ = ["VGPU_TIME", "PlacementWriter"]

log = logging.getLogger(__name__)

VGPU_TIME = "hami.io/vgpu-time"


class PlacementWriter:
    """Writes decisions onto pods through the cluster port, and tells the state which write counted them."""

    def __init__(self, cluster: Cluster, plugins: VendorPlugins, state: ClusterState) -> None:
        self.cluster = cluster
        self.plugins = plugins
        self.state = state

    def record(self, undo: Transaction, decision: Decision) -> str:
        """Write the decision; on any failure take back what the filter did (`undo`: the assumption, the quota
        reservation) and say why ("" when written)."""
        pod, node = decision.pod, decision.node
        try:
            with undo:
                self.write(decision)
        except ClusterError as exc:
            return f"could not record the placement of {pod.namespace}/{pod.name} on {node}: {exc}"
        except Exception as exc:  # the writer thread must answer every bind, whatever failed
            log.exception("recording the placement of %s/%s failed", pod.namespace, pod.name)
            return f"could not record the placement of {pod.namespace}/{pod.name} on {node}: {exc}"
        return ""

    def write(self, decision: Decision, *, also: Mapping[str, str] | None = None) -> None:
        """Write the placement and the vendors' pod annotations (`NodeFit.pod_annotations`); on a clash of
        keys, the placement's own annotations win. With placement keys, the same write signs the placement
        (`hami.signing`): the allocated annotations and the vendors' ones, for this pod's UID on its node. `also`:
        annotations written in the same patch but not signed (the bind phase, with `record_at_bind`)."""
        pod, node = decision.pod, decision.node
        annotations: dict[str, str | None] = dict(decision.annotations)
        annotations.update(also or {})
        annotations.update({VGPU_NODE_ANNOTATION: node, VGPU_TIME: str(int(time.time()))})
        signed: dict[str, str] = {k: v for k, v in decision.annotations.items() if v is not None}
        for kind, placements in decision.allocation.items():
            keys = self.plugins.kind(kind).annotations
            value = encode_pod_devices(placements)
            if keys.to_allocate is not None:
                annotations[keys.to_allocate] = value
            annotations[keys.allocated] = value
            signed[keys.allocated] = value
        signer = self.state.usage.signer
        if signer is not None:
            annotations[SIGNATURE_ANNOTATION] = signer.sign(SignedPlacement(pod.uid, node, signed))
        patched = self.cluster.patch_metadata(
            "pods", pod.name, pod.namespace, annotations=annotations, labels={VGPU_NODE_ANNOTATION: node}
        )
        self.state.note_own_write(pod.namespace, pod.name, pod.uid, meta(patched).get("resourceVersion"))

    def withdraw(self, pod: Pod) -> None:
        """Remove an abandoned placement from the pod, so that the watch does not count it again (best effort)."""
        annotations: dict[str, str | None] = {VGPU_NODE_ANNOTATION: None, VGPU_TIME: None, SIGNATURE_ANNOTATION: None}
        for kind in self.plugins.kinds:
            if kind.annotations.to_allocate is not None:
                annotations[kind.annotations.to_allocate] = None
            annotations[kind.annotations.allocated] = None
        try:
            self.cluster.patch_metadata(
                "pods", pod.name, pod.namespace, annotations=annotations, labels={VGPU_NODE_ANNOTATION: None}
            )
        except ClusterError as exc:
            log.warning("could not withdraw the abandoned placement of %s/%s: %s", pod.namespace, pod.name, exc)
