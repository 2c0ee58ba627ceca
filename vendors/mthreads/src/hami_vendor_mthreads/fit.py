"""Fitting Moore Threads GPUs: core's share fitter with HAMi's Moore Threads rules, and the pod annotations.

Owns the rules layered on `hami.topology.TopologyFitter` (health, cordons, slots, memory, cores in sixteenths, the
device policies, ``topology-aware`` over `hami_vendor_mthreads.discovery.SCORE_ANNOTATION`):

* one GPU per pod (HAMi's ``customFilterRule``: "Mthreads needs all devices on a device"): when several
  containers of a pod ask for Moore Threads GPUs, they all share one GPU, so each must ask for one GPU; a pod
  with a multi-GPU container beside another Moore Threads container is refused with a reason saying so. The GPU
  is the one the device policy prefers among those that hold every container (binpack: the fullest; spread: the
  emptiest);
* selectors ``mthreads.ai/use-gpuuuid`` / ``nouse-gpuuuid`` name GPUs by UUID, or by HAMi's capacity name
  ``<node>-mthreads-<i>`` (the only name HAMi's scheduler knows), which stands for that node's GPU ``i``;
* the annotations HAMi writes with the placement (``PatchAnnotations``), which Moore Threads' components read:
  ``mthreads.com/gpu-index`` (the indices of the last container's GPUs, comma-separated), ``mthreads.com/
  predicate-node`` (the node) and ``mthreads.com/predicate-time`` (nanoseconds since the epoch).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence

from hami.fitting import Selectors, node_score
from hami.model import ContainerPlacement, ContainerRequest, DeviceKind, NodeFit, NodeView, Pod, SchedulingPolicy
from hami.topology import TopologyFitter, scores_from_annotation
from hami_vendor_mthreads.discovery import CAPACITY_NAME, SCORE_ANNOTATION

__all__ = ["GPU_INDEX", "PREDICATE_NODE", "PREDICATE_TIME", "MthreadsFitter", "placement_annotations"]

GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_NODE = "mthreads.com/predicate-node"
PREDICATE_TIME = "mthreads.com/predicate-time"


def placement_annotations(node: NodeView, placement: Sequence[ContainerPlacement], now_ns: int) -> dict[str, str]:
    """HAMi's Moore Threads pod annotations for `placement` on `node`."""
    index = {u.device.id: u.device.index for u in node.devices}
    last = [c for c in placement if c]
    if not last:
        return {}
    return {
        GPU_INDEX: ",".join(str(index.get(d.uuid, 0)) for d in last[-1]),
        PREDICATE_NODE: node.name,
        PREDICATE_TIME: str(now_ns),
    }


class MthreadsFitter(TopologyFitter):
    """`TopologyFitter` with the one-GPU-per-pod rule, HAMi's selector names and HAMi's pod annotations."""

    def __init__(self, kind: DeviceKind, *, clock: Callable[[], int] = time.time_ns) -> None:
        super().__init__(kind, links=scores_from_annotation(SCORE_ANNOTATION))
        self.clock = clock

    def fit_nodes(
        self, pod: Pod, requests: Sequence[ContainerRequest | None], nodes: Sequence[NodeView], policy: SchedulingPolicy
    ) -> list[NodeFit]:
        asked = [r for r in requests if r is not None]
        if len(asked) > 1 and any(r.count > 1 for r in asked):
            reason = (
                f"pod: {len(asked)} containers ask for Moore Threads GPUs and one asks for several; HAMi puts all "
                "of a pod's Moore Threads containers on one GPU, so each must ask for one (mthreads.com/vgpu: 1)"
            )
            return [NodeFit(node=n.name, reason=reason) for n in nodes]
        base = Selectors(self.kind, pod)
        now = self.clock()
        out = []
        for node in nodes:
            selectors = self._selectors_on(node, base)
            fit = self._fit_shared(pod, requests, node, policy, selectors) if len(asked) > 1 else \
                self.fit_node(pod, requests, node, policy, selectors)  # fmt: skip
            if fit.placement is not None:
                annotations = placement_annotations(node, fit.placement, now)
                fit = fit.model_copy(update={"pod_annotations": {**fit.pod_annotations, **annotations}})
            out.append(fit)
        return out

    @staticmethod
    def _selectors_on(node: NodeView, base: Selectors) -> Selectors:
        """`base` with HAMi's capacity names of `node`'s GPUs replaced by their UUIDs."""
        alias = re.compile(re.escape(f"{node.name}-{CAPACITY_NAME}-") + r"([0-9]+)")
        if not any(alias.fullmatch(u) for u in base.use_uuid | base.nouse_uuid):
            return base
        by_index = {str(u.device.index): u.device.id for u in node.devices}

        def resolve(names: set[str]) -> set[str]:
            out = set()
            for n in names:
                m = alias.fullmatch(n)
                out.add(by_index.get(m.group(1), n) if m else n)
            return out

        copy = Selectors.__new__(Selectors)
        copy.__dict__.update(base.__dict__)
        copy.use_uuid, copy.nouse_uuid = resolve(base.use_uuid), resolve(base.nouse_uuid)
        return copy

    def _fit_shared(
        self,
        pod: Pod,
        requests: Sequence[ContainerRequest | None],
        node: NodeView,
        policy: SchedulingPolicy,
        selectors: Selectors,
    ) -> NodeFit:
        """Every container on one GPU: the policy's favourite GPU among those that hold them all."""
        fits: list[tuple[float, int, NodeFit]] = []
        reasons: list[str] = []
        for usage in node.devices:
            alone = node.model_copy(update={"devices": [usage]})
            fit = self.fit_node(pod, requests, alone, policy, selectors)
            if fit.placement is None:
                reasons.append(fit.reason)
                continue
            score = node_score(node, fit.placement, pod.run_order)
            fits.append((score, usage.device.index, fit))
        if not fits:
            why = reasons[0] if len(set(reasons)) == 1 else "; ".join(sorted(set(reasons)))
            return NodeFit(node=node.name, reason=f"no one GPU holds all of the pod's Moore Threads containers ({why})")
        spread = "spread" in policy.device and not ("binpack" in policy.device or "best-fit" in policy.device)
        score, _, best = min(fits, key=lambda f: (f[0] if spread else -f[0], f[1]))
        return best.model_copy(update={"score": score})
