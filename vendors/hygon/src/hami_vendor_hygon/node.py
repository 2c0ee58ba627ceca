"""The node side's Hygon state: where DCUs are read from, and the DCUs last read.

Owns the choice of source (ROCm SMI through `hami_vendor_hygon.dtk` when ``librocm_smi64.so`` loads, else
``hy-smi`` through `hami_vendor_hygon.hysmi`: core's `hami.vendordriver.DriverReader`, in Hygon's words), DMI's
session (opened when ``libhydmi.so`` loads; it gives the compute units and makes virtual devices), the sessions'
lifecycle (opened on first use, dropped and reopened after a failure), messages about a missing driver (each said
once, core's `hami.vendordriver.Said`), and the devices of the last read, which allocation
and container edits use to turn a placement's UUIDs into devices. On simulated devices (`simulate`, from
`hami_simulated_devices`) the devices are the inventory's and no driver is read. For the node-side backstop,
`NodeRuntime.processes`: the compute processes ROCm SMI reports and their VRAM on each DCU (none from hy-smi); for
the node monitor, `NodeRuntime.readings`: each DCU's VRAM in use, busy share, power and temperature from ROCm SMI
(none from hy-smi, whose device lines this node reads give none of them).

One runtime per settings object (`runtime_for`), so that two `VendorPlugins` (two tests) never share one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hami.model import DeviceProcess, DeviceReading
from hami.vendordriver import DriverReader, DriverWords, Said, per_device
from hami.vendorstate import devices_named
from hami_vendor_hygon.dtk import Dcu, Dmi, DtkError, DtkUnavailable, Rsmi
from hami_vendor_hygon.hysmi import read_devices
from hami_vendor_hygon.models import compute_units_of, model_of
from hami_vendor_hygon.settings import VDCU, HygonSettings
from hami_vendor_hygon.vdcu import VdcuState

__all__ = ["NodeRuntime", "runtime_for"]

log = logging.getLogger("hami_vendor_hygon")


WORDS = DriverWords(
    "ROCm SMI",
    "the DCUs",
    from_tool="{problem}: Hygon DCUs are read from hy-smi instead",
    nothing="{problem}, and {error}: this node reports no Hygon DCU",
)


@dataclass
class NodeRuntime:
    settings: HygonSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    dmi_session: Dmi | None = None
    devices: list[Dcu] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    """What the last read could not use (malformed tool lines, devices left out)."""
    _dmi_tried: bool = False
    _reconciled: bool = False
    simulated: bool = False
    """The devices are a simulated inventory's (`simulate`): no driver is read."""
    reader: DriverReader[Rsmi] = field(init=False)
    _dmi_said: Said = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(
            log, WORDS, lambda: Rsmi.open(self.settings.rocm_smi_library), ("rocm-smi", "hy-smi")
        )
        self._dmi_said = Said(log)

    @property
    def rsmi(self) -> Rsmi | None:
        """The open ROCm SMI session, or None."""
        return self.reader.session

    @property
    def source(self) -> str:
        """Where the DCUs were last read from: ``rocm-smi``, ``hy-smi``, ``simulated``, or empty (nowhere)."""
        return self.reader.source

    def simulate(self, devices: list[Dcu]) -> None:
        """From now on, this node's DCUs are `devices` and no driver is read."""
        with self.lock:
            self.simulated = True
            self.devices = devices
            self.reader.source = "simulated"

    def reconcile_once(self) -> None:
        """Once per daemon: destroy the driver's virtual devices that no vdev directory names (a crash)."""
        with self.lock:
            if self._reconciled:
                return
            self._reconciled = True
            VdcuState(self.settings.vdev_dir, self.settings.exporter_dir).reconcile(self.dmi())

    def reconciled_with(self, live_pods: Sequence[str]) -> None:
        """The daemon's start, given the pods (UIDs) still on the node: remove every other pod's vDCU, and destroy
        the driver's virtual devices no directory names."""
        with self.lock:
            if self.settings.dcu_mode != VDCU:
                return
            self._reconciled = True
            dmi = None if self.simulated else self.dmi()
            VdcuState(self.settings.vdev_dir, self.settings.exporter_dir).reconcile(dmi, live_pods)

    def dmi(self) -> Dmi | None:
        """DMI's session, None where libhydmi.so is absent (tried again at every read of the devices)."""
        with self.lock:
            if self.dmi_session is None and not self._dmi_tried:
                self._dmi_tried = True
                try:
                    self.dmi_session = Dmi.open(self.settings.dmi_library)
                    log.info("Hygon DMI opened from %s", self.dmi_session.where)
                except DtkUnavailable as exc:
                    message = f"no Hygon DMI ({exc}): compute units come from the model table, no vDCU is created"
                    self._dmi_said(logging.INFO, message)
            return self.dmi_session

    def read_devices(self) -> list[Dcu]:
        """This node's DCUs now, from ROCm SMI, else hy-smi; none (said once) when neither works."""
        with self.lock:
            if self.simulated:
                return self.devices
            self._dmi_tried = False
            self.problems = []
            devices = self.reader.read(Rsmi.devices, self._from_hy_smi) or []
            for p in self.problems:
                log.error("%s", p)
            dmi = self.dmi() if devices else None
            self.devices = [self._with_compute_units(d, dmi) for d in devices]
            if dmi is not None and self.settings.dcu_mode == VDCU:
                self.reconcile_once()
            return self.devices

    def _from_hy_smi(self) -> list[Dcu]:
        report = read_devices(self.settings.hy_smi)
        self.problems = report.problems
        return report.devices

    def processes(self) -> list[DeviceProcess] | None:
        """Each compute process on this node's DCUs and the VRAM ROCm SMI counts for it there; None on simulated
        devices, without ROCm SMI, or when it fails this round (the backstop then checks nothing rather than
        something half-read)."""
        with self.lock:
            if self.simulated:
                return None
            devices = self.devices if self.rsmi is not None else self.read_devices()
            if self.rsmi is None:
                return None
            try:
                report = self.rsmi.processes()
            except DtkError as exc:
                log.warning("cannot read the DCUs' compute processes this round: %s", exc)
                return None
            if report.unsplit:
                log.warning("ROCm SMI at %s cannot split the VRAM of processes %s over their DCUs "
                            "(no rsmi_compute_process_info_by_device_get): they are not checked",
                            self.rsmi.where, ", ".join(map(str, report.unsplit)))  # fmt: skip
            uuid_of = {d.index: d.uuid for d in devices}
            return [DeviceProcess(device_uuid=uuid_of[index], pid=pid, used_bytes=used)
                    for index, pid, used in report.found if index in uuid_of]  # fmt: skip

    def readings(self) -> list[DeviceReading] | None:
        """What ROCm SMI reads from each of this node's DCUs now; None on simulated devices, without ROCm SMI, or
        when it fails this round (the monitor then shows the DCUs' figures unknown)."""
        with self.lock:
            if self.simulated:
                return None
            devices = self.devices if self.rsmi is not None else self.read_devices()
            rsmi = self.rsmi
            if rsmi is None:
                return None
            return per_device(log, "the DCUs' figures", devices, lambda d: [rsmi.readings(d.index, d.uuid)])

    def _with_compute_units(self, device: Dcu, dmi: Dmi | None) -> Dcu:
        if dmi is not None:
            try:
                return replace(device, compute_units=dmi.compute_units(device.index))
            except DtkError as exc:
                log.warning("DMI cannot tell the compute units of DCU %d (%s)", device.index, exc)
        model = model_of(device.device_id)
        return replace(device, compute_units=compute_units_of(model) if model else None)

    def by_uuid(self, uuids: Sequence[str]) -> list[Dcu]:
        """The devices with these UUIDs (read again when one is not known).

        :raises HamiError: a UUID is not a DCU of this node.
        """
        with self.lock:
            return devices_named(uuids, self.devices, self.read_devices, what="Hygon DCU", name_of=lambda d: d.uuid)


def runtime_for(settings: HygonSettings) -> NodeRuntime:
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))
