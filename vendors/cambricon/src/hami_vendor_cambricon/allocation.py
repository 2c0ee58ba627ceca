"""Allocation on the node: a placement made real for Cambricon's device plugin contract, container edits, release.

Owns what the node daemon does inside the kubelet's Allocate for MLUs, and its undoing:

* `allocate`: the placement's cards resolved to this node's cards (a real UUID, or HAMi's capacity name
  ``<node>-cambricon-mlu-<i>`` when HAMi's scheduler placed the pod), rewritten with the real UUIDs; a container
  granted a share of one card gets its sMLU instance (`hami_vendor_cambricon.smlu`, sized from the placement);
  the pod is marked served as Cambricon's plugin marks it: the assigned flag ``"true"`` under both spellings and
  ``CAMBRICON_DSMLU_PROFILE_INSTANCE`` = ``<profile>_<instance handle>_<card>_<instance id>`` (informational:
  nothing here reads it back); and the node lock HAMi's scheduler takes for MLU pods,
  ``cambricon.com/dsmlu.lock`` (RFC 3339 time), released, as Cambricon's plugin releases it once the pod is served.
* `container_edits`: what Cambricon's device plugin gives a container (without its container runtime). Whole
  cards: ``CAMBRICON_VISIBLE_DEVICES`` (the card indices, comma-joined), the device nodes
  ``/dev/cambricon_dev<N>``. A share: ``VIRTUAL_DEVICES`` = ``/dev/cambricon_dev<N>,/dev/cambricon_ipcm<N>,<the
  instance's node>`` (the form Cambricon's container runtime reads) and the device nodes themselves:
  ``/dev/cambricon_dev<N>``, ``/dev/cambricon_ipcm<N>`` where the host has it, and the instance's
  ``/dev/cambricon-caps/cap_dev<N>_mi<M>``. Both: ``/dev/cambricon_ctl`` and cnmon mounted read-only when
  `cnmonPath` is set.
* `release` and `reconcile`: the pod's sMLU instances destroyed when it finishes, and after a restart those of
  pods no longer on the node.

A node in the soft mode (``mluMode: hami-core``) makes no sMLU: the cards are passed through whole and the
isolation library enforces the share (`hami_vendor_cambricon.soft`: accounting directory, library, grant).

On simulated cards (no CNDev, no cnmon: `hami demo`) no instance can be made: a share is then served as a whole
card and the log says so. A node that reads its cards from cnmon refuses shares (no CNDev, no sMLU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from hami.errors import HamiError
from hami.model import Allocation, ContainerEdits, ContainerPlacement, DeviceNode, IsolationLibrary, Mount, Pod
from hami_vendor_cambricon import smlu, soft
from hami_vendor_cambricon.cndev import MluCard, SmluInstance
from hami_vendor_cambricon.discovery import NodeRuntime, runtime_for
from hami_vendor_cambricon.fit import ASSIGNED_ANNOTATIONS
from hami_vendor_cambricon.settings import SOFT, CambriconSettings

__all__ = [
    "CONTROL_DEVICE",
    "INSTANCE_ANNOTATION",
    "LOCK_ANNOTATION",
    "VIRTUAL_DEVICES",
    "VISIBLE_DEVICES",
    "allocate",
    "container_edits",
    "reconcile",
    "release",
]

log = logging.getLogger("hami_vendor_cambricon")

VISIBLE_DEVICES = "CAMBRICON_VISIBLE_DEVICES"
VIRTUAL_DEVICES = "VIRTUAL_DEVICES"
CONTROL_DEVICE = "/dev/cambricon_ctl"
LOCK_ANNOTATION = "cambricon.com/dsmlu.lock"
INSTANCE_ANNOTATION = "CAMBRICON_DSMLU_PROFILE_INSTANCE"


def _share_of(runtime: NodeRuntime, devices: ContainerPlacement) -> MluCard | None:
    """The card a container gets a share of (one card, less than its whole compute or memory), else None. A
    placement without memory is a whole card (core's form of "all of it")."""
    if len(devices) != 1 or devices[0].usedmem <= 0:
        return None
    card = runtime.card_of(devices[0].uuid)
    whole = devices[0].usedcores >= 100 and (card.memory_mib == 0 or devices[0].usedmem >= card.memory_mib)
    return None if whole else card


def _instance(runtime: NodeRuntime, pod: Pod, index: int, devices: ContainerPlacement) -> SmluInstance | None:
    """The container's sMLU instance as the driver has it; None for whole cards and simulated cards.

    :raises HamiError: the container has a share but its instance is not there.
    """
    card = _share_of(runtime, devices)
    if card is None or runtime.cndev is None:
        return None
    name = smlu.instance_name(pod.uid, index)
    try:
        found = smlu.instance_of(runtime.cndev, card.index, name)
    except Exception as exc:
        raise HamiError(f"cannot read the sMLU instances of MLU {card.index}: {exc}") from None
    if found is None:
        raise HamiError(f"the sMLU instance {name} of this container is not on MLU {card.index} (destroyed?)")
    return found


def allocate(settings: CambriconSettings, pod: Pod, container_index: int, devices: ContainerPlacement) -> Allocation:
    """The placement with this node's card UUIDs, the share's sMLU made, the assigned flag set, the dsmlu node
    lock released.

    :raises hami.errors.HamiError: a placed card is not on this node, or the sMLU cannot be made.
    """
    runtime = runtime_for(settings)
    resolved = tuple(d.model_copy(update={"uuid": runtime.card_of(d.uuid).uuid}) for d in devices)
    annotations = dict.fromkeys(ASSIGNED_ANNOTATIONS, "true")
    if settings.mlu_mode == SOFT:
        if resolved:
            soft.prepare(settings, pod, container_index)
        return Allocation(devices=resolved, pod_annotations=annotations, node_annotations={LOCK_ANNOTATION: None})
    with runtime.lock:
        card = _share_of(runtime, resolved)
        if card is not None and runtime.cndev is None and runtime.source == "cnmon":
            raise HamiError(
                f"MLU {card.index}: this node reads its cards from cnmon (libcndev.so cannot be loaded), so no "
                "sMLU share can be made: install CNDev, or ask for whole cards"
            )
        if card is not None and runtime.cndev is None:
            log.warning("no CNDev on this node: the share of MLU %d is served as the whole card", card.index)
        elif card is not None and runtime.cndev is not None:
            runtime.reconcile_once()
            name = smlu.instance_name(pod.uid, container_index)
            made, _ = smlu.create(runtime.cndev, card, name, resolved[0].usedcores, resolved[0].usedmem)
            annotations[INSTANCE_ANNOTATION] = f"{made.profile_id}_{made.handle}_{card.index}_{made.instance_id}"
    return Allocation(devices=resolved, pod_annotations=annotations, node_annotations={LOCK_ANNOTATION: None})


def release(settings: CambriconSettings, pod: Pod) -> None:
    """Destroy the pod's sMLU instances and remove its soft-mode directories (none: nothing to do)."""
    soft.release(settings, pod)
    if settings.mlu_mode == SOFT:
        return
    runtime = runtime_for(settings)
    with runtime.lock:
        if runtime.cndev is None and not runtime.read_cards():
            return
        if runtime.cndev is not None and pod.uid:
            smlu.release(runtime.cndev, runtime.cards, pod.uid)


def reconcile(settings: CambriconSettings, pods: Sequence[Pod]) -> None:
    """After a restart: destroy the sMLU instances of pods no longer on this node."""
    runtime = runtime_for(settings)
    with runtime.lock:
        runtime.live_pods = {p.uid for p in pods if p.uid}
        runtime.reconciled = False
        runtime.reconcile_once()


def _node(path: str) -> DeviceNode:
    return DeviceNode(container_path=path, host_path=path)


def container_edits(
    settings: CambriconSettings,
    pod: Pod,
    container_index: int,
    devices: ContainerPlacement,
    library: IsolationLibrary | None = None,
) -> ContainerEdits:
    """The env, device nodes and mounts of a container given these cards (or its share of one); in the soft mode
    the whole cards plus the isolation library's edits."""
    runtime = runtime_for(settings)
    with runtime.lock:
        indices = [runtime.card_of(d.uuid).index for d in devices]
        instance = None if settings.mlu_mode == SOFT else _instance(runtime, pod, container_index, devices)
    mounts = []
    if settings.cnmon_path:
        mounts.append(Mount(container_path=settings.cnmon_path, host_path=settings.cnmon_path, read_only=True))
    if instance is not None:
        card = instance.card
        paths = [f"/dev/cambricon_dev{card}", f"/dev/cambricon_ipcm{card}", instance.device_node]
        nodes = [_node(paths[0])]
        if os.path.exists(paths[1]):
            nodes.append(_node(paths[1]))
        nodes += [_node(instance.device_node), _node(CONTROL_DEVICE)]
        return ContainerEdits(env={VIRTUAL_DEVICES: ",".join(paths)}, devices=tuple(nodes), mounts=tuple(mounts))
    nodes = [_node(f"/dev/cambricon_dev{i}") for i in indices]
    nodes.append(_node(CONTROL_DEVICE))
    cards = ContainerEdits(
        env={VISIBLE_DEVICES: ",".join(str(i) for i in indices)}, devices=tuple(nodes), mounts=tuple(mounts)
    )
    if settings.mlu_mode == SOFT and devices:
        return soft.container_edits(settings, pod, container_index, devices, cards, library)
    return cards
