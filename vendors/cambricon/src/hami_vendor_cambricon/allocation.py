"""Allocation on the node: a placement made real for Cambricon's device plugin contract, and container edits.

Owns what the node daemon does inside the kubelet's Allocate for MLUs:

* `allocate`: the placement's cards resolved to this node's cards (a real UUID, or HAMi's capacity name
  ``<node>-cambricon-mlu-<i>`` when HAMi's scheduler placed the pod), rewritten with the real UUIDs, and the pod
  marked served as Cambricon's plugin marks it: the assigned flag ``"true"`` under both spellings; and the node
  lock HAMi's scheduler takes for MLU pods, ``cambricon.com/dsmlu.lock`` (RFC 3339 time), released, as
  Cambricon's plugin releases it once the pod is served (HAMi's scheduler otherwise waits 2 minutes for it).
* `container_edits`: what Cambricon's device plugin gives a container (without its container runtime):
  ``CAMBRICON_VISIBLE_DEVICES`` (the card indices, comma-joined), the device nodes ``/dev/cambricon_dev<N>`` and
  ``/dev/cambricon_ctl``, and cnmon mounted read-only when `cnmonPath` is set.

Nothing is created on the host, so nothing is undone on release: the dynamic-sMLU instance itself
(``cndevCreateSMluInstanceByProfileId``) is not created by this daemon (see the README).
"""

from __future__ import annotations

from hami.model import Allocation, ContainerEdits, ContainerPlacement, DeviceNode, Mount, Pod
from hami_vendor_cambricon.discovery import runtime_for
from hami_vendor_cambricon.fit import ASSIGNED_ANNOTATIONS
from hami_vendor_cambricon.settings import CambriconSettings

__all__ = ["CONTROL_DEVICE", "LOCK_ANNOTATION", "VISIBLE_DEVICES", "allocate", "container_edits"]

VISIBLE_DEVICES = "CAMBRICON_VISIBLE_DEVICES"
CONTROL_DEVICE = "/dev/cambricon_ctl"
LOCK_ANNOTATION = "cambricon.com/dsmlu.lock"


def allocate(settings: CambriconSettings, pod: Pod, devices: ContainerPlacement) -> Allocation:
    """The placement with this node's card UUIDs, the assigned flag set, the dsmlu node lock released.

    :raises hami.errors.HamiError: a placed card is not on this node.
    """
    runtime = runtime_for(settings)
    resolved = tuple(d.model_copy(update={"uuid": runtime.card_of(d.uuid).uuid}) for d in devices)
    return Allocation(
        devices=resolved,
        pod_annotations=dict.fromkeys(ASSIGNED_ANNOTATIONS, "true"),
        node_annotations={LOCK_ANNOTATION: None},
    )


def container_edits(settings: CambriconSettings, devices: ContainerPlacement) -> ContainerEdits:
    """The env, device nodes and mounts of a container given these cards."""
    runtime = runtime_for(settings)
    indices = [runtime.card_of(d.uuid).index for d in devices]
    nodes = [DeviceNode(container_path=f"/dev/cambricon_dev{i}", host_path=f"/dev/cambricon_dev{i}") for i in indices]
    nodes.append(DeviceNode(container_path=CONTROL_DEVICE, host_path=CONTROL_DEVICE))
    mounts = []
    if settings.cnmon_path:
        mounts.append(Mount(container_path=settings.cnmon_path, host_path=settings.cnmon_path, read_only=True))
    return ContainerEdits(
        env={VISIBLE_DEVICES: ",".join(str(i) for i in indices)}, devices=tuple(nodes), mounts=tuple(mounts)
    )
