"""Driver-level virtual DCUs (HAMi's mode): compute-unit masks, the ``vdev*.conf`` file, and their life on disk.

Owns the host side of HAMi's DCU plugin contract with Hygon's driver:

* which containers get one: a container granted exactly one DCU and less than its whole memory (HAMi's rule;
  a whole DCU, or several, are passed through as they are);
* the compute units: ``cu_count = cores% × CUs / 100`` (rounded down, at least 1), taken from the device's free
  CUs, lowest first, as two 64-bit masks (CUs 0–63 and 64–127) written as 16 hex digits each, HAMi's form.
  (HAMi's own nibble walk can hand out a CU already in use; this one never does, and writes the same format);
* the directory ``<vdevDir>/<pod uid>_<container>_<device index>_<pipe id>_<vdev id>_<mask 1>_<mask 2>`` holding
  ``vdev<vdev id>.conf``, mounted at ``/etc/vdev/docker/``, and the copy ``<exporterDir>/vdev<vdev id>.conf``
  for Hygon's exporter; the file body is HAMi's (``PciBusId``, two ``cu_mask`` lines, ``cu_count``,
  ``mem: <MiB> MiB``, ``device_id``, ``vdev_id``, ``pipe_id``, ``enable: 1``);
* the driver's virtual device: created through DMI (``dmiCreateVDevices``, CUs and MiB) where DMI is present, its
  id the file's ``vdev_id``, after DMI's ``dmiGetDeviceRemainingInfo`` says the device has the CUs and memory left
  (a share it has no room for is refused with its figures); destroyed at release.

Everything the node must remember is on disk, in the directory names: CUs in use, vdev and pipe ids. A restarted
daemon reads them back (`VdcuState.scan`), and `reconcile` destroys the driver's virtual devices that no directory
names (created by a daemon that died before it wrote the file), and, given the pods still on the node (the daemon's
`hami_reconcile` at start), the vDCUs of pods deleted while it was down. Pod UIDs and container names have no
``_``, so a directory name splits unambiguously.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hami.errors import HamiError
from hami_vendor_hygon.dtk import Dcu, Dmi, DtkError

__all__ = ["MAX_CUS", "VdevEntry", "VdcuState", "allocate_mask", "cu_count", "format_conf", "mask_text"]

log = logging.getLogger("hami_vendor_hygon")

MAX_CUS = 128
CONTAINER_DIR = "/etc/vdev/docker/"
MAX_PIPES = 4


def cu_count(cores_percent: int, compute_units: int) -> int:
    """HAMi's ``reqcores``: the CUs of a share of `cores_percent` percent (a share of 0 gets 1 CU)."""
    return max(1, cores_percent * compute_units // 100)


def mask_text(mask: int) -> str:
    """HAMi's written form of one 64-bit CU mask: 16 hex digits."""
    return f"{mask & (2**64 - 1):016x}"


def allocate_mask(used: int, compute_units: int, count: int) -> int:
    """`count` free CUs of a device of `compute_units` (lowest first) as a 128-bit mask; 0 when too few are free."""
    chosen = 0
    for cu in range(min(compute_units, MAX_CUS)):
        if count == 0:
            break
        bit = 1 << cu
        if not used & bit:
            chosen |= bit
            count -= 1
    return chosen if count == 0 else 0


def format_conf(bdf: str, mask: int, cus: int, memory_mib: int, device: int, vdev: int, pipe: int) -> str:
    low, high = mask & (2**64 - 1), mask >> 64
    return (
        f"PciBusId: {bdf}\n"
        f"cu_mask: 0x{mask_text(low)}\n"
        f"cu_mask: 0x{mask_text(high)}\n"
        f"cu_count: {cus}\n"
        f"mem: {memory_mib} MiB\n"
        f"device_id: {device}\n"
        f"vdev_id: {vdev}\n"
        f"pipe_id: {pipe}\n"
        "enable: 1\n"
    )


@dataclass(frozen=True)
class VdevEntry:
    """One container's vDCU, as its directory name records it."""

    pod_uid: str
    container: str
    device: int
    pipe: int
    vdev: int
    mask: int

    @property
    def name(self) -> str:
        low, high = self.mask & (2**64 - 1), self.mask >> 64
        return "_".join(
            [
                self.pod_uid,
                self.container,
                str(self.device),
                str(self.pipe),
                str(self.vdev),
                mask_text(low),
                mask_text(high),
            ]
        )

    @classmethod
    def parse(cls, name: str) -> VdevEntry | None:
        parts = name.split("_")
        if len(parts) != 7:
            return None
        try:
            device, pipe, vdev = int(parts[2]), int(parts[3]), int(parts[4])
            mask = int(parts[5], 16) | (int(parts[6], 16) << 64)
        except ValueError:
            return None
        return cls(parts[0], parts[1], device, pipe, vdev, mask)


class VdcuState:
    """The vDCUs of this node, read from `<vdevDir>` (see the module's docstring)."""

    def __init__(self, vdev_dir: Path, exporter_dir: Path) -> None:
        self.vdev_dir = vdev_dir
        self.exporter_dir = exporter_dir

    def scan(self) -> list[VdevEntry]:
        try:
            names = sorted(p.name for p in self.vdev_dir.iterdir() if p.is_dir())
        except OSError:
            return []
        return [e for e in (VdevEntry.parse(n) for n in names) if e is not None]

    def find(self, pod_uid: str, container: str) -> VdevEntry | None:
        for entry in self.scan():
            if entry.pod_uid == pod_uid and entry.container == container:
                return entry
        return None

    def directory(self, entry: VdevEntry) -> Path:
        return self.vdev_dir / entry.name

    def create(
        self, pod_uid: str, container: str, device: Dcu, cores: int, memory_mib: int, dmi: Dmi | None
    ) -> VdevEntry:
        """The container's vDCU: the existing one (Allocate retried), else a new one (see the module's doc).

        :raises HamiError: the device has too few free CUs, no free pipe, or the driver refused.
        """
        existing = self.find(pod_uid, container)
        if existing is not None:
            return existing
        if device.compute_units is None:
            raise HamiError(
                f"DCU {device.uuid}: its compute units are unknown (no DMI, model not in the table), so no vDCU "
                "can be cut; install libhydmi.so or grant whole DCUs"
            )
        entries = self.scan()
        used = 0
        for e in entries:
            if e.device == device.index:
                used |= e.mask
        cus = cu_count(cores, device.compute_units)
        mask = allocate_mask(used, device.compute_units, cus)
        if not mask:
            free = device.compute_units - bin(used).count("1")
            raise HamiError(f"DCU {device.uuid} has {free} free compute units, the share needs {cus}")
        pipes = {e.pipe for e in entries if e.device == device.index}
        pipe = next((p for p in range(MAX_PIPES) if p not in pipes), None)
        if pipe is None:
            raise HamiError(f"DCU {device.uuid} already serves {MAX_PIPES} vDCUs (every pipe is taken)")
        if dmi is not None:
            _check_remaining(dmi, device, cus, memory_mib)
            try:
                vdev = dmi.create(device.index, cus, memory_mib).id
            except DtkError as exc:
                raise HamiError(f"creating the vDCU on DCU {device.uuid} failed: {exc}") from None
        else:
            ids = {e.vdev for e in entries}
            vdev = next(i for i in range(len(ids) + 1) if i not in ids)
        entry = VdevEntry(pod_uid, container, device.index, pipe, vdev, mask)
        body = format_conf(device.bdf, mask, cus, memory_mib, device.index, vdev, pipe)
        try:
            self._write(self.directory(entry), f"vdev{vdev}.conf", body)
            self._write(self.exporter_dir, f"vdev{vdev}.conf", body)
        except OSError as exc:
            shutil.rmtree(self.directory(entry), ignore_errors=True)
            if dmi is not None:
                _destroy(dmi, vdev)
            raise HamiError(f"cannot write the vDCU file under {self.vdev_dir}: {exc}") from None
        log.info("vDCU %d on DCU %s: %d CUs, %d MiB, pipe %d", vdev, device.uuid, cus, memory_mib, pipe)
        return entry

    @staticmethod
    def _write(directory: Path, name: str, body: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o777)  # HAMi's mode: the container's user reads (and the driver updates) it
        tmp = directory / f".{name}.tmp"
        tmp.write_text(body)
        os.replace(tmp, directory / name)

    def release(self, pod_uid: str, dmi: Dmi | None) -> int:
        """Remove every vDCU of the pod (directories, exporter copies, the driver's devices); how many."""
        gone = [e for e in self.scan() if e.pod_uid == pod_uid]
        for entry in gone:
            self._remove(entry, dmi)
        return len(gone)

    def _remove(self, entry: VdevEntry, dmi: Dmi | None) -> None:
        if dmi is not None:
            _destroy(dmi, entry.vdev)
        with contextlib.suppress(OSError):
            (self.exporter_dir / f"vdev{entry.vdev}.conf").unlink(missing_ok=True)
        shutil.rmtree(self.directory(entry), ignore_errors=True)
        log.info("vDCU %d of pod %s released", entry.vdev, entry.pod_uid)

    def reconcile(self, dmi: Dmi | None, live_pods: Iterable[str] | None = None) -> None:
        """After a restart: destroy the driver's virtual devices no directory names, and, when `live_pods` is
        given, the vDCUs of pods not in it."""
        entries = self.scan()
        if live_pods is not None:
            alive = set(live_pods)
            for entry in [e for e in entries if e.pod_uid not in alive]:
                self._remove(entry, dmi)
            entries = self.scan()
        if dmi is None:
            return
        named = {e.vdev for e in entries}
        try:
            orphans = [v for v in dmi.virtual_devices() if v.id not in named]
        except DtkError as exc:
            log.warning("cannot list the virtual DCUs (%s); orphans are not cleaned up", exc)
            return
        for v in orphans:
            log.warning("virtual DCU %d on DCU %d has no vdev file (left by a crash); destroying it", v.id, v.device)
            _destroy(dmi, v.id)


def _check_remaining(dmi: Dmi, device: Dcu, cus: int, memory_mib: int) -> None:
    """Refuse, with the driver's figures, a vDCU the driver has no room for (CUs or memory given to virtual devices
    this node does not know of, say); a driver that cannot say is left to decide at creation.

    :raises HamiError: DMI's remaining CUs or memory on `device` are fewer than the share needs."""
    try:
        free_cus, free_bytes = dmi.remaining(device.index)
    except DtkError as exc:
        log.warning("DMI cannot tell what DCU %s has left (%s); asking it to create the vDCU anyway", device.uuid, exc)
        return
    free_mib = free_bytes // (1024 * 1024)
    if free_cus < cus or free_mib < memory_mib:
        raise HamiError(
            f"DCU {device.uuid}: the driver has {free_cus} compute units and {free_mib} MiB not given to virtual "
            f"devices (dmiGetDeviceRemainingInfo), the share needs {cus} and {memory_mib} MiB"
        )


def _destroy(dmi: Dmi, vdev: int) -> None:
    try:
        dmi.destroy(vdev)
    except DtkError as exc:
        log.error("destroying virtual DCU %d failed: %s", vdev, exc)
