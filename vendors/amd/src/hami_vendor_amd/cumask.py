"""The compute units of each GPU, given to containers without overlap: HAMi's AMD CU-mask split, on the node.

Owns what HAMi's AMD device plugin does at Allocate in ``cu-mask`` mode: a container granted ``n`` compute units of a
GPU (the scheduler's ``usedcores`` for it: ``floor(percent × CUs / 100)``, at least 1) gets the ``n``
lowest-numbered units of that GPU no other container on the node holds; its ``HSA_CU_MASK`` is
``<i>:<units>[;<i>:<units>…]``, ``<i>`` the GPU's position in the container's ``ROCR_VISIBLE_DEVICES`` and
``<units>`` ROCr's CU ID-list grammar (``0-75``, ``0-3,8,10-12``); and the pod's annotation
``hami.io/amd-cu-allocated`` records the units of all its containers per GPU UUID (JSON), as HAMi's plugin writes it.

Which units are held is this node's own record, never a pod's annotation (a tenant may patch its pod): one file per
container, ``<hookPath>/cu/containers/<pod uid>_<container>/units.json`` (``{uuid: ID list}``), written at Allocate
(Allocate retried for the same container finds its units again), removed with the pod (`release`), and after a
restart for pods no longer on the node (`keep_only`). Allocation is serialized per node by the daemon.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

from hami.errors import HamiError
from hami.isolation.containers import ContainerDirs
from hami.model import ContainerPlacement, Pod
from hami_vendor_amd.node import AmdGpu

__all__ = ["CU_ANNOTATION", "CuMasks", "id_list", "parse_id_list"]

log = logging.getLogger("hami_vendor_amd")

CU_ANNOTATION = "hami.io/amd-cu-allocated"
_FILE = "units.json"
_LOCK = threading.Lock()


def id_list(units: Iterable[int]) -> str:
    """ROCr's CU ID list of `units` (``0-3,8,10-12``)."""
    ordered = sorted(set(units))
    runs: list[str] = []
    start = prev = -2
    for u in [*ordered, -1]:
        if u != prev + 1:
            if start >= 0:
                runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = u
        prev = u
    return ",".join(runs)


def parse_id_list(text: str) -> set[int]:
    """The units of an ID list. :raises ValueError: it is not one."""
    units: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 0 or last < first:
            raise ValueError(f"{part!r} is not a CU range")
        units.update(range(first, last + 1))
    return units


class CuMasks:
    """The CU-mask records under ``<hookPath>/cu``."""

    def __init__(self, hook_path: Path) -> None:
        self.dirs = ContainerDirs(Path(hook_path) / "cu", "AMD compute-unit")

    def _read(self, path: Path) -> dict[str, set[int]]:
        try:
            raw = json.loads(path.read_text())
            return {str(uuid): parse_id_list(str(units)) for uuid, units in raw.items()}
        except (OSError, ValueError, AttributeError) as exc:
            log.error("ignoring the unreadable CU record %s: %s", path, exc)
            return {}

    def held(self, skip: Path | None = None) -> dict[str, set[int]]:
        """The units every recorded container holds, per GPU UUID (but the record `skip`)."""
        out: dict[str, set[int]] = {}
        for path in sorted(self.dirs.containers.glob(f"*/{_FILE}")):
            if path != skip:
                for uuid, units in self._read(path).items():
                    out.setdefault(uuid, set()).update(units)
        return out

    def allocate(self, pod: Pod, index: int, devices: ContainerPlacement, gpus: Sequence[AmdGpu]) -> dict[str, str]:
        """The units of container `index` on each of its GPUs (ID lists by UUID), chosen now or found again.

        :raises HamiError: a GPU has fewer free units than granted, or the record cannot be written."""
        record = Path(self.dirs.accounting_dir(pod, index)) / _FILE
        with _LOCK:
            if record.is_file():
                found = self._read(record)
                if set(found) == {d.uuid for d in devices}:
                    return {uuid: id_list(units) for uuid, units in found.items()}
            held = self.held(skip=record)
            chosen: dict[str, str] = {}
            for device, gpu in zip(devices, gpus, strict=True):
                taken = held.get(device.uuid, set())
                free = [u for u in range(gpu.compute_units) if u not in taken]
                want = max(1, min(device.usedcores, gpu.compute_units))
                if len(free) < want:
                    raise HamiError(
                        f"AMD GPU {device.uuid} has {len(free)} free compute units on this node and the container "
                        f"was granted {want}: the node's CU record and the scheduler's view disagree"
                    )
                chosen[device.uuid] = id_list(free[:want])
            try:
                record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                record.write_text(json.dumps(chosen, sort_keys=True))
            except OSError as exc:
                raise HamiError(f"cannot record the container's compute units in {record}: {exc}") from None
            return chosen

    def of_pod(self, pod: Pod, containers: int) -> dict[str, str]:
        """The units of every recorded container of `pod`, merged per GPU (the annotation's value)."""
        merged: dict[str, set[int]] = {}
        for index in range(containers):
            for uuid, units in self._read_if(Path(self.dirs.accounting_dir(pod, index)) / _FILE).items():
                merged.setdefault(uuid, set()).update(units)
        return {uuid: id_list(units) for uuid, units in sorted(merged.items())}

    def of_container(self, pod: Pod, index: int) -> dict[str, str]:
        """The units recorded for container `index` (ID lists by UUID); empty when none were chosen."""
        return {
            u: id_list(units) for u, units in self._read_if(Path(self.dirs.accounting_dir(pod, index)) / _FILE).items()
        }

    def _read_if(self, path: Path) -> dict[str, set[int]]:
        return self._read(path) if path.is_file() else {}

    def release(self, pod: Pod) -> None:
        self.dirs.release(pod)

    def keep_only(self, pods: Sequence[Pod]) -> list[str]:
        return self.dirs.keep_only(pods)
