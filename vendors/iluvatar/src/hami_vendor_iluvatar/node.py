"""The node side's Iluvatar state: the ixML session and the GPUs last read.

Owns the session's lifecycle (opened on first use, dropped and reopened after a failure) and the message about a
missing driver (said once, and again when it changes), both through core's `hami.vendordriver.DriverReader` in
Iluvatar's words (HAMi's Iluvatar support reads no tool: without ixML the node reports no GPU), and the GPUs of the
last read (with which share a board), which container edits use to turn a placement's UUIDs into GPUs (device
nodes). A GPU ixML cannot name (no handle, no UUID) is left out with an
error line naming it; the node keeps serving the others. On simulated devices (`simulate`, from
`hami_simulated_devices`) the GPUs are the inventory's and ixML is not opened. Also the compute processes on
given GPUs, for the node-side backstop (`NodeRuntime.processes`), and their readings, for the node monitor
(`NodeRuntime.readings`). One runtime per settings object (`runtime_for`), so that two `VendorPlugins` (two
tests) never share one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from hami.model import DeviceProcess, DeviceReading
from hami.vendordriver import DriverReader, DriverWords, per_device
from hami.vendorstate import devices_named
from hami_vendor_iluvatar.ixml import Gpu, Ixml, IxmlError
from hami_vendor_iluvatar.settings import IluvatarSettings

T = TypeVar("T")

__all__ = ["NodeRuntime", "runtime_for"]

log = logging.getLogger("hami_vendor_iluvatar")


WORDS = DriverWords(
    "ixML",
    "the Iluvatar GPUs",
    no_library="{error}: this node reports no Iluvatar GPU",
    read_failed="reading the Iluvatar GPUs failed ({error}): this node reports none until ixML answers",
    no_tool="{problem}",
    opened="ixML opened from {where}",
)


@dataclass
class NodeRuntime:
    settings: IluvatarSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    gpus: list[Gpu] = field(default_factory=list)
    boards: dict[str, dict[str, bool]] = field(default_factory=dict)
    """UUID -> peer UUID -> on the same board, for the GPUs last read (empty where ixML cannot tell)."""
    problems: list[str] = field(default_factory=list)
    simulated: dict[str, list[Gpu]] | None = None
    """The GPUs a simulated inventory stands in for ixML with, by kind (`simulate`); None on hardware."""
    reader: DriverReader[Ixml] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Ixml.open(self.settings.ixml_library))

    @property
    def session(self) -> Ixml | None:
        """The open ixML session, or None."""
        return self.reader.session

    def simulate(self, common_word: str, gpus: list[Gpu]) -> None:
        """From now on, this node's GPUs of kind `common_word` are `gpus` and ixML is not read."""
        with self.lock:
            self.simulated = {**(self.simulated or {}), common_word: gpus}
            self.gpus = [gpu for group in self.simulated.values() for gpu in group]

    def read_gpus(self) -> list[Gpu]:
        """This node's GPUs now; none (said once) without ixML."""
        with self.lock:
            if self.simulated is not None:
                return self.gpus
            self.problems = []
            gpus = self.reader.read(self._from_ixml)
            if gpus is None:
                self.gpus = []
                return self.gpus
            self.gpus = gpus
            self.boards = self._boards(gpus)
            return gpus

    def _from_ixml(self, session: Ixml) -> list[Gpu]:
        count = session.count()
        gpus = []
        for index in range(count):
            try:
                gpus.append(session.gpu(index))
            except IxmlError as exc:
                problem = f"Iluvatar GPU {index} is not reported: {exc}"
                log.error("%s", problem)
                self.problems.append(problem)
        self.reader.said.forget()
        return gpus

    def _boards(self, gpus: list[Gpu]) -> dict[str, dict[str, bool]]:
        assert self.session is not None
        boards: dict[str, dict[str, bool]] = {g.uuid: {} for g in gpus}
        try:
            for i, a in enumerate(gpus):
                for b in gpus[i + 1 :]:
                    same = self.session.same_board(a.index, b.index)
                    boards[a.uuid][b.uuid] = boards[b.uuid][a.uuid] = same
        except IxmlError as exc:
            log.info("ixML cannot tell which Iluvatar chips share a board (%s): no link scores", exc)
            return {}
        return boards

    def known_gpus(self) -> list[Gpu]:
        """The GPUs of the last read (read now when there was none)."""
        with self.lock:
            return self.gpus or self.read_gpus()

    def processes(self, gpus: Sequence[Gpu]) -> list[DeviceProcess] | None:
        """Each compute process on `gpus` and the memory ixML counts for it; None on simulated devices, without
        ixML, or when ixML fails this round (the backstop then checks nothing rather than something half-read)."""
        return self._per_gpu(gpus, "compute processes", lambda session, gpu: [
            DeviceProcess(device_uuid=gpu.uuid, pid=pid, used_bytes=used)
            for pid, used in session.compute_processes(gpu.index)])  # fmt: skip

    def readings(self, gpus: Sequence[Gpu]) -> list[DeviceReading] | None:
        """What ixML reads from each of `gpus` now; None as for `processes` (the monitor then shows them unknown)."""
        return self._per_gpu(gpus, "readings", lambda session, gpu: [session.readings(gpu.index, gpu.uuid)])

    def _per_gpu(self, gpus: Sequence[Gpu], what: str, read: Callable[[Ixml, Gpu], list[T]]) -> list[T] | None:
        with self.lock:
            session = self.session
            if self.simulated is not None or session is None:
                return None
            return per_device(log, f"the Iluvatar GPUs' {what}", gpus, lambda gpu: read(session, gpu))

    def by_uuid(self, uuids: Sequence[str]) -> list[Gpu]:
        """The GPUs with these UUIDs (read again when one is not known).

        :raises HamiError: a UUID is not a GPU of this node."""
        with self.lock:
            return devices_named(uuids, self.gpus, self.read_gpus, what="Iluvatar GPU", name_of=lambda g: g.uuid)


def runtime_for(settings: IluvatarSettings) -> NodeRuntime:
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))
