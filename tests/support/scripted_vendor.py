"""A vendor plugin whose devices come from a JSON script file, for testing the node daemon.

Three device kinds, one per register format: `Scripted` (JSON register), `ScriptedLegacy` (legacy string)
and `ScriptedCap` (no register annotation: node capacity, with a memory resource in GiB units). Its
settings name the script (`vendors.scripted.script`); discovery reads it at every call, so a test changes
what the node has (health included) by rewriting the file:

    {"devices": {"Scripted": [{"id": "SCR-0", "count": 4, "devmem": 8192, "numa": 0, "health": true}]},
     "refuse": ["SCR-1"], "refuse_allocate": [], "edits_delay": 0}

`refuse`: container edits for a placement with one of these devices raise `HamiError`; `refuse_allocate`:
the same from `hami_allocate`; `edits_delay`: seconds each container edit takes (to see serialization);
`allocate_annotations`: pod annotations `hami_allocate` returns with each container's placement (a value's
`{container}` is replaced by the container's index); `reserve`: each fit reserves the devices it places in
the pod annotation `scripted.example/reserved`, and no fit places a pod on a device that a pod counted on the
node has reserved there (a stand-in for partition reservations). Containers mount the library the daemon installed (at
the same path) and its preload file when the daemon passes one, as a real vendor's edits do.

In-process tests register the module with `VendorPlugins.from_plugins({"scripted": scripted_vendor})`; the
daemon process gets it installed as the package `hami_vendor_scripted` (see `node_harness`), with the dummy
isolation library `libscripted.so` beside it. `RELEASED` and `CONCURRENCY` record calls in-process.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from hami import hookimpl
from hami.errors import HamiError
from hami.fitting import ShareFitter
from hami.model import (
    Allocation,
    AnnotationKeys,
    Container,
    ContainerEdits,
    ContainerPlacement,
    ContainerRequest,
    Device,
    DeviceKind,
    DeviceNode,
    DeviceUsage,
    IsolationLibrary,
    Mount,
    NodeFit,
    NodeInventory,
    NodeView,
    Pod,
    RegisterFormat,
    ResourceNames,
    SchedulingPolicy,
    VendorInfo,
)
from hami.requests import read_share_request


def _kind(word: str, prefix: str, fmt: RegisterFormat, unit: int = 1) -> DeviceKind:
    lower = word.lower()
    return DeviceKind(
        common_word=word,
        resources=ResourceNames(
            count=f"{prefix}/accel",
            memory=f"{prefix}/accel-memory",
            cores=f"{prefix}/accel-cores",
            memory_unit_mib=unit,
        ),
        annotations=AnnotationKeys(
            node_register=None if fmt == RegisterFormat.CAPACITY else f"hami.io/node-{lower}-register",
            node_handshake=None if fmt == RegisterFormat.CAPACITY else f"hami.io/node-handshake-{lower}",
            to_allocate=f"hami.io/{lower}-devices-to-allocate",
            allocated=f"hami.io/{lower}-devices-allocated",
        ),
        register_format=fmt,
    )


SCRIPTED = _kind("Scripted", "scripted.example", RegisterFormat.JSON)
LEGACY = _kind("ScriptedLegacy", "legacy.example", RegisterFormat.LEGACY)
CAPACITY = _kind("ScriptedCap", "cap.example", RegisterFormat.CAPACITY, unit=1024)
KINDS = {k.common_word: k for k in (SCRIPTED, LEGACY, CAPACITY)}

INFO = VendorInfo(
    name="scripted", display_name="Scripted (tests)", kinds=tuple(KINDS.values()), isolation_library="libscripted.so"
)

RESERVED = "scripted.example/reserved"
"""Pod annotation of the `reserve` script knob: the devices a fit reserved, comma-separated."""

RELEASED: list[tuple[str, str, int]] = []
"""(kind, pod name, containers with devices) for every `hami_release` call in this process."""
RECONCILED: list[tuple[str, list[str]]] = []
"""(kind, names of the pods given) for every `hami_reconcile` call in this process."""
CONCURRENCY = {"now": 0, "max": 0}
_guard = threading.Lock()


class ScriptedSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    script: Path = Path("/nonexistent/scripted.json")


def _script(settings: ScriptedSettings) -> dict[str, Any]:
    try:
        data = json.loads(settings.script.read_text())
    except FileNotFoundError:
        return {}
    return data if isinstance(data, dict) else {}


@hookimpl
def hami_vendor_info() -> VendorInfo:
    return INFO


@hookimpl
def hami_vendor_settings(raw: Mapping[str, Any]) -> ScriptedSettings:
    return ScriptedSettings.model_validate(raw)


@hookimpl
def hami_discover_devices(settings: ScriptedSettings) -> list[NodeInventory]:
    found = []
    for word, devices in sorted((_script(settings).get("devices") or {}).items()):
        kind = KINDS[word]
        parsed = tuple(Device(**{"type": word, "mode": "hami-core", **d}) for d in devices)
        found.append(NodeInventory(kind=kind.common_word, devices=parsed))
    return found


@hookimpl
def hami_container_request(kind: DeviceKind, container: Container) -> ContainerRequest | None:
    return read_share_request(kind, container)


@hookimpl
def hami_fit_nodes(
    kind: DeviceKind,
    pod: Pod,
    requests: Sequence[ContainerRequest | None],
    nodes: Sequence[NodeView],
    policy: SchedulingPolicy,
    settings: ScriptedSettings,
) -> list[NodeFit]:
    if not _script(settings).get("reserve"):
        return ShareFitter(kind).fit_nodes(pod, requests, nodes, policy)
    fits = []
    for node in nodes:
        taken = {d for p in node.pods.values() for d in p.annotations.get(RESERVED, "").split(",") if d}
        (fit,) = ShareFitter(kind, extra_filter=_refuse_reserved(taken)).fit_nodes(pod, requests, [node], policy)
        if fit.placement is not None:
            reserved = ",".join(d.uuid for devices in fit.placement for d in devices)
            fit = fit.model_copy(update={"pod_annotations": {RESERVED: reserved}})
        fits.append(fit)
    return fits


def _refuse_reserved(taken: set[str]) -> Callable[[DeviceUsage, ContainerRequest], str | None]:
    return lambda usage, request: "reserved by another pod" if usage.id in taken else None


@hookimpl
def hami_allocate(
    devices: ContainerPlacement, container_index: int, settings: ScriptedSettings
) -> Allocation | ContainerPlacement | None:
    script = _script(settings)
    refused = set(script.get("refuse_allocate") or ())
    for d in devices:
        if d.uuid in refused:
            raise HamiError(f"device {d.uuid} cannot be partitioned (refused by the script)")
    annotations = script.get("allocate_annotations") or {}
    on_node = script.get("allocate_node_annotations") or {}
    if annotations or on_node:
        written = {str(k): str(v).replace("{container}", str(container_index)) for k, v in annotations.items()}
        return Allocation(devices=devices, pod_annotations=written, node_annotations=on_node)
    return None


@hookimpl
def hami_release(kind: DeviceKind, pod: Pod, placements: Sequence[ContainerPlacement]) -> None:
    RELEASED.append((kind.common_word, pod.name, sum(1 for p in placements if p)))


@hookimpl
def hami_reconcile(kind: DeviceKind, pods: Sequence[Pod]) -> None:
    RECONCILED.append((kind.common_word, sorted(p.name for p in pods)))


@hookimpl
def hami_container_edits(
    kind: DeviceKind,
    pod: Pod,
    devices: ContainerPlacement,
    container_index: int,
    settings: ScriptedSettings,
    library: IsolationLibrary | None,
) -> ContainerEdits:
    script = _script(settings)
    with _guard:
        CONCURRENCY["now"] += 1
        CONCURRENCY["max"] = max(CONCURRENCY["max"], CONCURRENCY["now"])
    try:
        delay = float(script.get("edits_delay") or 0)
        if delay:
            time.sleep(delay)
        refused = set(script.get("refuse") or ())
        for d in devices:
            if d.uuid in refused:
                raise HamiError(f"device {d.uuid} is refused by the script")
        prefix = kind.common_word.upper()
        env = {
            f"{prefix}_VISIBLE_DEVICES": ",".join(d.uuid for d in devices),
            f"{prefix}_CONTAINER": str(container_index),
        }
        for i, d in enumerate(devices):
            env[f"{prefix}_MEMORY_LIMIT_{i}"] = f"{d.usedmem}m"
        env[f"{prefix}_CORE_LIMIT"] = str(devices[0].usedcores) if devices else "0"
        for key, value in sorted(pod.annotations.items()):
            if key.startswith("scripted.example/"):  # what earlier allocations of the pod wrote
                env[f"{prefix}_SEEN_{key.rpartition('/')[2].upper().replace('-', '_')}"] = value
        mounts: tuple[Mount, ...] = ()
        if library is not None:
            mounts = (
                Mount(container_path=library.path, host_path=library.path),
                Mount(container_path="/etc/ld.so.preload", host_path=library.preload_path),
            )
        return ContainerEdits(
            env=env,
            mounts=mounts,
            devices=tuple(
                DeviceNode(container_path=f"/dev/{d.uuid.lower()}", host_path=f"/dev/{d.uuid.lower()}") for d in devices
            ),
            cdi_devices=tuple(f"{kind.resources.count}={d.uuid}" for d in devices),
        )
    finally:
        with _guard:
            CONCURRENCY["now"] -= 1
