"""What the kubelet adds to a container granted whole Enflame GCUs, computed from its placement.

Owns the container side of HAMi's ``GCU`` kind, as Enflame's device plugin and container toolkit give it:
``ENFLAME_VISIBLE_DEVICES``, the granted GCUs' indices as EFML numbers them, comma-separated (the selector
Enflame's container toolkit reads), and the device nodes ``<devRoot>/gcu<index>`` of those GCUs with the control
node ``<devRoot>/gcuctl`` (so the container works without the toolkit too). A placement names a GCU by its UUID or
by HAMi's capacity name ``<node>-GCU-<index>``. Whole cards need no isolation library: nothing is shared.
Deterministic: the same placement gives the same edits.
"""

from __future__ import annotations

from hami.model import ContainerEdits, ContainerPlacement, DeviceNode
from hami_vendor_enflame.discovery import runtime_for
from hami_vendor_enflame.settings import EnflameSettings

__all__ = ["CONTROL_NODE", "VISIBLE_DEVICES", "container_edits"]

VISIBLE_DEVICES = "ENFLAME_VISIBLE_DEVICES"
CONTROL_NODE = "gcuctl"


def container_edits(settings: EnflameSettings, devices: ContainerPlacement) -> ContainerEdits:
    """The container's edits. :raises hami.errors.HamiError: a placed GCU is not on this node."""
    if not devices:
        return ContainerEdits()
    runtime = runtime_for(settings)
    indices = [runtime.gcu_of(d.uuid).index for d in devices]
    root = settings.dev_root.rstrip("/")
    nodes = [f"{root}/gcu{i}" for i in indices] + [f"{root}/{CONTROL_NODE}"]
    return ContainerEdits(
        env={VISIBLE_DEVICES: ",".join(str(i) for i in indices)},
        devices=tuple(DeviceNode(container_path=n.replace(root, "/dev", 1), host_path=n) for n in nodes),
    )
