"""Discovery: this node's NVIDIA GPUs as HAMi's device plugin registers them.

Owns turning NVML's view (`hami_vendor_nvidia.nvml`) into the node's `NodeInventory`:

* one `Device` per GPU, with exactly the values HAMi v2.10 writes in ``hami.io/node-nvidia-register``: the
  UUID and index, the split count, memory in MiB times ``deviceMemoryScaling`` (truncated, as Go converts),
  cores as 100 × ``deviceCoreScaling``, the model prefixed ``NVIDIA-`` when NVML's name lacks it, the NUMA node
  read from sysfs (``<sysfsRoot>/bus/pci/devices/<bus id>/numa_node``; 0 when unknown, as HAMi), health, and
  the mode: ``mig`` for a GPU with MIG enabled (no scaling then, and its allowed MIG profiles with their
  placements in ``migProfiles``), else ``operatingMode``;
* pairwise link scores (HAMi's ``hami.io/node-nvidia-score``): per pair, the PCIe distance (same board 60,
  one switch 50, several switches 40, host bridge 30, same CPU 20, across CPUs 10) plus 100 per NVLink, direct
  or, between two GPUs both attached to NVSwitches, the smaller number of switch links; a pair whose links
  are not seen the same from both ends scores 0;
* the MIG instances that exist on the node (``hami.io/node-nvidia-mig-instances``), so the scheduler knows
  which placements are taken.

Health: critical XID errors (except the application XIDs in ``ignoredXids``) and lost GPUs make a GPU
unhealthy until the daemon restarts; each round polls the events without waiting. A node without NVML
reports nothing and says so once. Nothing here writes to the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hami.codec import encode_link_scores
from hami.model import Device, NodeInventory
from hami.pcidevice import numa_node, short_bus_id
from hami_vendor_nvidia.mig import (
    MIG_INSTANCES_ANNOTATION,
    MigProfile,
    Placement,
    ReportedInstance,
    encode_instances,
)
from hami_vendor_nvidia.node import NodeRuntime, runtime_for
from hami_vendor_nvidia.nvml import GpuInfo, MigProfileInfo, NvLink, Nvml, NvmlError
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = [
    "LINK_SCORE_ANNOTATION",
    "NVLINK_SCORE",
    "P2P_SCORES",
    "discover",
    "link_scores",
    "model_name",
    "numa_node",
    "register_profiles",
]

log = logging.getLogger("hami_vendor_nvidia")

LINK_SCORE_ANNOTATION = "hami.io/node-nvidia-score"
KIND = "NVIDIA"

P2P_SCORES = {0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}
"""NVML topology level (closest common ancestor) → HAMi's P2P score."""
NVLINK_SCORE = 100


def model_name(nvml_name: str) -> str:
    """The register's ``type``: NVML's name, prefixed ``NVIDIA-`` when it does not start with NVIDIA (HAMi)."""
    return nvml_name if nvml_name.startswith("NVIDIA") else f"NVIDIA-{nvml_name}"


def register_profiles(profiles: Sequence[MigProfileInfo], allowed: Sequence[str] | None) -> tuple[MigProfile, ...]:
    """The MIG profiles a GPU publishes: those allowed (all but ``+me``-style variants when `allowed` is None),
    each with its memory, compute share (its slices over the GPU's, rounded down so a full geometry never
    exceeds 100), slice count and legal placements."""
    total = max((p.slices for p in profiles), default=0)
    out = []
    for p in profiles:
        if allowed is None and "+" in p.name:
            continue
        if allowed is not None and p.name not in allowed:
            continue
        core = 100 * p.slices // total if total else 0
        out.append(MigProfile(p.name, p.memory_mib, core, p.slices, tuple(Placement(s, z) for s, z in p.placements)))
    return tuple(out)


def _nvlink_count(links: Sequence[NvLink], peer_links: Sequence[NvLink], peer_bus: str) -> int:
    direct = sum(1 for link in links if not link.to_switch and short_bus_id(link.remote_bus_id) == peer_bus)
    if direct or not links:
        return direct
    mine = sum(1 for link in links if link.to_switch)
    theirs = sum(1 for link in peer_links if link.to_switch)
    return min(mine, theirs) if mine and theirs else 0


def link_scores(
    uuids: Sequence[str],
    buses: Sequence[str],
    levels: Sequence[Sequence[int | None]],
    nvlinks: Sequence[Sequence[NvLink]],
) -> dict[str, dict[str, int]]:
    """HAMi's pairwise scores from the PCIe levels and NVLinks of every GPU (indexes are positions here)."""
    short = [short_bus_id(b) for b in buses]

    def links(i: int, j: int) -> list[int]:
        found = []
        if levels[i][j] is not None and levels[i][j] in P2P_SCORES:
            found.append(P2P_SCORES[levels[i][j]])  # type: ignore[index]
        count = _nvlink_count(nvlinks[i], nvlinks[j], short[j])
        if count:
            found.append(NVLINK_SCORE * count)
        return found

    scores: dict[str, dict[str, int]] = {}
    for i, a in enumerate(uuids):
        peers = {}
        for j, b in enumerate(uuids):
            if i == j:
                continue
            there, back = links(i, j), links(j, i)
            peers[b] = sum(there) if len(there) == len(back) else 0
        scores[a] = peers
    return scores


def discover(settings: NvidiaSettings) -> list[NodeInventory]:
    """This node's NVIDIA inventory; ``[]`` when there is no NVML or no GPU."""
    runtime = runtime_for(settings)
    with runtime.lock:
        nvml = runtime.session()
        if nvml is None:
            return []
        try:
            inventory = _inventory(runtime, nvml)
        except NvmlError as exc:
            runtime.drop_session(exc)
            return []
    return [inventory] if inventory.devices else []


def _inventory(runtime: NodeRuntime, nvml: Nvml) -> NodeInventory:
    settings = runtime.settings
    if settings.health_check and not runtime.watched:
        nvml.watch_xids()
        runtime.watched = True
    gpus: list[GpuInfo] = []
    for index in range(nvml.count):
        try:
            gpus.append(nvml.gpu(index))
        except NvmlError as exc:
            log.error("GPU %d cannot be read through NVML, it is not reported: %s", index, exc)
    runtime.gpus = {g.uuid: g for g in gpus}
    by_index = {g.index: g for g in gpus}
    if settings.health_check:
        for event in nvml.poll_xids():
            gpu = by_index.get(event.gpu_index)
            if gpu is None:
                continue
            if event.xid in settings.ignored_xids:
                log.info("GPU %s reported XID %d, an application error; it stays healthy", gpu.uuid, event.xid)
            elif event.gpu_instance_id is not None:
                log.warning("GPU %s: XID %d on MIG instance %d", gpu.uuid, event.xid, event.gpu_instance_id)
            else:
                runtime.mark_unhealthy(gpu.uuid, f"critical XID {event.xid}")
    devices = [d for g in gpus if (d := _device(runtime, g)) is not None]
    annotations: dict[str, str] = {}
    scores: dict[str, dict[str, int]] = {}
    if settings.publish_link_scores and len(gpus) > 1:
        positions = [g.index for g in gpus]
        levels = [[nvml.p2p_level(a, b) if a != b else None for b in positions] for a in positions]
        scores = link_scores(
            [g.uuid for g in gpus], [g.bus_id for g in gpus], levels, [nvml.nvlinks(i) for i in positions]
        )
        annotations[LINK_SCORE_ANNOTATION] = encode_link_scores(scores)
    mig_gpus = [g for g in gpus if g.mig_enabled and not g.lost]
    if mig_gpus:
        instances = [
            ReportedInstance(
                m.gpu_uuid,
                m.profile,
                Placement(m.start, m.size),
                m.uuid,
                m.gpu_instance_id,
                m.compute_instance_id,
            )
            for g in mig_gpus
            for m in nvml.mig_instances(g.index)
        ]
        annotations[MIG_INSTANCES_ANNOTATION] = encode_instances(instances)
    return NodeInventory(kind=KIND, devices=tuple(devices), link_scores=scores, annotations=annotations)


def _device(runtime: NodeRuntime, gpu: GpuInfo) -> Device | None:
    settings = runtime.settings
    memory = gpu.memory_mib
    if gpu.lost:
        runtime.mark_unhealthy(gpu.uuid, "NVML reports the GPU is lost")
        memory = runtime.last_memory.get(gpu.uuid, 0)
    elif memory is None:
        if not settings.preconfigured_device_memory:
            log.error(
                "GPU %s does not report its memory (a unified-memory GPU?) and preConfiguredDeviceMemory is not "
                "set; it is not reported. Set nvidia.preConfiguredDeviceMemory to its memory in MiB.",
                gpu.uuid,
            )
            return None
        memory = settings.preconfigured_device_memory
    else:
        runtime.last_memory[gpu.uuid] = memory
    numa = numa_node(settings.sysfs_root, gpu.bus_id)
    profiles: tuple[MigProfile, ...] = ()
    if gpu.mig_enabled:
        devmem, devcore, mode = memory, 100, "mig"
        profiles = register_profiles(gpu.mig_profiles, settings.allowed_mig_profiles(gpu.name))
        if not profiles and not gpu.lost:
            log.warning("GPU %s is in MIG mode but allows no MIG profile; nothing can be placed on it", gpu.uuid)
    else:
        devmem = int(memory * settings.device_memory_scaling)
        devcore = int(settings.device_core_scaling * 100)
        mode = settings.operating_mode
    return Device(
        id=gpu.uuid,
        index=gpu.index,
        count=settings.device_split_count,
        devmem=devmem,
        devcore=devcore,
        type=model_name(gpu.name),
        numa=numa or 0,
        health=gpu.uuid not in runtime.unhealthy and not gpu.lost,
        mode=mode,
        mig_profiles=tuple(p.to_register() for p in profiles),
    )
