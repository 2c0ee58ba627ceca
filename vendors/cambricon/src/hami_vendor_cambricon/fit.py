"""Fitting MLUs: core's share fitter with the dynamic-sMLU rules, and the pod annotations the profile needs.

Owns the Cambricon rules layered on `hami.topology.TopologyFitter` (core's share fitter: health, selectors
``cambricon.com/use-gpuuuid`` / ``use-mlutype`` and their ``nouse`` forms, slots, memory, cores, exclusive use at
100 % cores, device policies; with ``topology-aware`` in the device policy, the best MLU-Link-connected set of
cards from the node's ``hami.io/node-cambricon-mlu-score``):

* HAMi's dynamic sMLU gives a pod one profile, ``CAMBRICON_DSMLU_PROFILE`` = ``<index>_<vcore>_<vmem in 256 MiB>``,
  which describes one card. A *share* (less than a whole card's compute or memory) therefore must be the pod's only
  MLU: one card in one container. A pod asking for a share of two cards, or for shares in two containers, is refused
  on every node with a reason saying so (HAMi would write the first card's profile and leave the others unshared).
  Whole cards (100 % cores and all the memory) need no slice, so any number of them may be asked.
* The fit carries the pod annotations Cambricon's device plugin reads: the profile of the pod's first granted card,
  and the assigned flag ``"false"`` under both spellings, ``CAMBRICON_DSMLU_ASSIGNED`` (HAMi v2.10) and
  ``CAMBRICON_DSMLU_ASSIGHED`` (what Cambricon's plugin still reads).
"""

from __future__ import annotations

from collections.abc import Sequence

from hami.model import (
    ContainerDevice,
    ContainerPlacement,
    ContainerRequest,
    DeviceKind,
    NodeFit,
    NodeView,
    Pod,
    SchedulingPolicy,
)
from hami.topology import TopologyFitter, scores_from_annotation

__all__ = ["ASSIGNED_ANNOTATIONS", "PROFILE_ANNOTATION", "fit_nodes", "profile_of", "share_problem"]

PROFILE_ANNOTATION = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED_ANNOTATIONS = ("CAMBRICON_DSMLU_ASSIGNED", "CAMBRICON_DSMLU_ASSIGHED")
MEMORY_UNIT_MIB = 256
LINK_ANNOTATION = "hami.io/node-cambricon-mlu-score"
"""The node's MLU-Link scores (published by `hami_vendor_cambricon.discovery`)."""


def _is_share(request: ContainerRequest) -> bool:
    whole_memory = request.memory == 0 and request.memory_percentage in (None, 100)
    return request.cores < 100 or not whole_memory


def share_problem(requests: Sequence[ContainerRequest | None]) -> str:
    """Why these requests cannot be served by one dynamic-sMLU profile; empty when they can."""
    asked = [r for r in requests if r is not None]
    shares = [r for r in asked if _is_share(r)]
    if not shares:
        return ""
    if len(asked) > 1:
        return (
            f"a dynamic-sMLU share must be the pod's only MLU request ({len(asked)} containers ask for MLUs): "
            "Cambricon's profile CAMBRICON_DSMLU_PROFILE describes one card"
        )
    if shares[0].count > 1:
        return (
            f"a dynamic-sMLU share covers one card ({shares[0].count} asked with less than the whole card): "
            "ask for one card, or for whole cards (vcore 100 and no vmemory)"
        )
    return ""


def profile_of(node: NodeView, placement: Sequence[ContainerPlacement]) -> str:
    """``<index>_<vcore>_<vmem in 256 MiB units>`` of the first granted card."""
    first: ContainerDevice = next(d for c in placement for d in c)
    index = next((u.device.index for u in node.devices if u.device.id == first.uuid), 0)
    return f"{index}_{first.usedcores}_{first.usedmem // MEMORY_UNIT_MIB}"


def fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
) -> list[NodeFit]:
    problem = share_problem(requests)
    if problem:
        return [NodeFit(node=n.name, reason=f"pod: {problem}") for n in nodes]
    fits = TopologyFitter(kind, links=scores_from_annotation(LINK_ANNOTATION)).fit_nodes(pod, requests, nodes, policy)
    by_name = {n.name: n for n in nodes}
    out = []
    for fit in fits:
        if fit.placement is not None and any(fit.placement):
            annotations = {PROFILE_ANNOTATION: profile_of(by_name[fit.node], fit.placement)}
            annotations.update(dict.fromkeys(ASSIGNED_ANNOTATIONS, "false"))
            fit = fit.model_copy(update={"pod_annotations": {**fit.pod_annotations, **annotations}})
        out.append(fit)
    return out
