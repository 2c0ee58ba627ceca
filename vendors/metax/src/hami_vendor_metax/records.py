"""The node's record of what it served: which cards, shares and QoS policy each MetaX container holds.

Owns one small JSON file per served container, ``<hookPath>/allocations/<pod uid>_<container>.json``
(``{"kind", "qos", "devices": [{"uuid", "compute", "vRam"}]}``, MetaX's own field names), written by the node
daemon at Allocate and removed when the pod is released. Discovery sums them into what MetaX's plugins publish
beside the totals (a card's available slots, compute and memory, its current QoS policy, the whole cards still
free), so the node's annotations follow its pods, as the plugins' do. The files are root-owned on the host and
never mounted into a container. A daemon restarted after a crash finds them where it left them, and removes those
of pods no longer on the node (`keep_only`: deleted while it was down), with any half-written scratch file; a file
that cannot be read is logged and counted as nothing.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hami.hostpaths import HostPathError, path_component, pod_path
from hami.model import ContainerPlacement, Pod
from hami_vendor_metax.settings import MetaxSettings

__all__ = ["Held", "container_name", "keep_only", "pod_key", "read_all", "release", "write"]

log = logging.getLogger("hami_vendor_metax")


@dataclass(frozen=True)
class Held:
    """One card share a served container holds."""

    kind: str
    uuid: str
    compute: int
    vram: int
    qos: str


def container_name(pod: Pod, index: int) -> str:
    containers = pod.all_containers
    return containers[index].name if 0 <= index < len(containers) else f"container-{index}"


def pod_key(pod: Pod) -> tuple[str, str]:
    return (pod.uid, "pod UID") if pod.uid else (pod.name, "pod name")


def _path(settings: MetaxSettings, pod: Pod, index: int) -> Path:
    name = pod_path(settings.records_dir, pod_key(pod), (container_name(pod, index), "container name"))
    return Path(f"{name}.json")


def write(settings: MetaxSettings, pod: Pod, index: int, kind: str, devices: ContainerPlacement, qos: str) -> None:
    """Record container `index`'s cards (replacing an earlier record of the same container: a retry).

    :raises HostPathError: the pod UID or container name cannot name a host file.
    :raises OSError: the record cannot be written.
    """
    path = _path(settings, pod, index)
    body = {
        "kind": kind,
        "qos": qos,
        "devices": [{"uuid": d.uuid, "compute": d.usedcores, "vRam": d.usedmem} for d in devices],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".record-")
    with os.fdopen(fd, "w") as out:
        json.dump(body, out)
    os.replace(scratch, path)


def read_all(settings: MetaxSettings) -> list[Held]:
    """Every share the node's served containers hold."""
    out: list[Held] = []
    try:
        files = sorted(settings.records_dir.glob("*.json"))
    except OSError:
        return out
    for path in files:
        try:
            body = json.loads(path.read_text())
            kind, qos = str(body["kind"]), str(body.get("qos") or "")
            out.extend(Held(kind, str(d["uuid"]), int(d["compute"]), int(d["vRam"]), qos) for d in body["devices"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring the MetaX allocation record %s: %s", path, exc)
    return out


def release(settings: MetaxSettings, pod: Pod, also: Sequence[Path] = ()) -> None:
    """Remove every record of `pod` (and its files under the directories `also`); nothing when there is none."""
    key = pod.uid or pod.name
    try:
        path_component(key, "pod UID")  # a hostile UID (`../x`) must not reach the globs below
    except HostPathError as exc:
        log.warning("not releasing pod %s/%s: %s", pod.namespace, pod.name, exc)
        return

    for directory in (settings.records_dir, *also):
        try:
            found = sorted(directory.glob(f"{key}_*"))
        except OSError:
            continue
        for path in found:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def keep_only(settings: MetaxSettings, pods: Sequence[Pod]) -> list[str]:
    """After a restart: remove the records of every pod not in `pods` (those still on the node), and scratch files
    a crash left half-written; returns the names removed. Only the file name is read (``<key>_<container>.json``,
    the key a UID or a name, neither of which holds ``_``): nothing a pod wrote decides it."""
    live = {pod_key(p)[0] for p in pods}
    removed: list[str] = []
    try:
        found = sorted(settings.records_dir.iterdir())
    except OSError:
        return removed
    for path in found:
        if path.name.startswith(".record-") or path.name.split("_", 1)[0] not in live:
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed
