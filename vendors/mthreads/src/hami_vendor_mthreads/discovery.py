"""Discovery: this node's Moore Threads GPUs, as the node publishes them, and the GPUs of the last read.

Owns the node runtime (`NodeRuntime`: the MTML session, opened on first use and reopened after a failure, the
``mthreads-gmi`` fallback when ``libmtml.so`` cannot be loaded, messages about a missing driver said once: core's
`hami.vendordriver.DriverReader`, in Moore Threads' words; and the
GPUs of the last read, which container edits use to turn a placement into GPUs; and, for the node monitor, what
MTML reads from them, `NodeRuntime.readings`) and the `NodeInventory` of kind
``Mthreads``: per GPU its MTML UUID, index, 100 slots (HAMi's ``Count``), memory in MiB, 16 cores (HAMi's
``Devcore``: sGPU cores are sixteenths of a GPU), the type ``Mthreads-<product name>`` (``Mthreads-MTT-S4000``:
HAMi's type for these GPUs is ``Mthreads``, which its type check finds in it), NUMA and health; and, where MTML
answers ``mtmlDeviceGetTopologyLevel``, link scores between the GPUs in `SCORE_ANNOTATION`.

What is published, and why: HAMi v2.10 has no register annotation for Moore Threads; its scheduler counts the GPUs
from the node's ``mthreads.com/sgpu-core`` capacity (16 per GPU), splits ``mthreads.com/sgpu-memory`` (512 MiB
units) evenly and names the GPUs ``<node>-mthreads-<i>``. The node daemon serves those resources, so HAMi's
scheduler reads this node, and also publishes `REGISTER_ANNOTATION` (JSON, HAMi's device form) with the real GPUs,
which this project's scheduler reads before the capacity, so it fits per GPU (UUID, memory, health, NUMA). A GPU
without a UUID is not published; one MTML cannot fully read is published unhealthy, with a log line saying why.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hami.codec import encode_link_scores
from hami.model import Device, DeviceReading, NodeInventory
from hami.vendordriver import DriverReader, DriverWords
from hami.vendorstate import capacity_index, devices_named, trailing_index
from hami_vendor_mthreads.gmi import read_gpus
from hami_vendor_mthreads.mtml import MtGpu, Mtml, MtmlError
from hami_vendor_mthreads.settings import CORES_PER_GPU, MthreadsSettings

__all__ = [
    "CAPACITY_NAME",
    "REGISTER_ANNOTATION",
    "SCORE_ANNOTATION",
    "NodeRuntime",
    "discover",
    "inventory",
    "link_score",
    "runtime_for",
    "type_of",
]

log = logging.getLogger("hami_vendor_mthreads")

REGISTER_ANNOTATION = "hami.io/node-mthreads-register"
"""This project's per-GPU register (JSON, HAMi's device form); HAMi's own scheduler ignores it."""
SCORE_ANNOTATION = "hami.io/node-mthreads-score"
"""Link scores between the GPUs (`hami.codec.encode_link_scores`), from MTML's topology levels."""
CAPACITY_NAME = "mthreads"
"""HAMi's capacity-derived GPU names: ``<node>-mthreads-<i>``."""
_SEPARATORS = re.compile(r"[\s,:;]+")


def type_of(gpu: MtGpu) -> str:
    """``Mthreads-<product name>`` with separators as dashes; ``Mthreads`` without a name."""
    name = _SEPARATORS.sub("-", gpu.name.strip()).strip("-")
    return f"Mthreads-{name}" if name else "Mthreads"


def link_score(level: int) -> int:
    """MTML's topology level (0 internal … 5 across NUMA nodes) as a link score, higher is closer: 60 … 10."""
    return max(0, 6 - level) * 10


def sysfs_bdf(text: str) -> str:
    """``dddd:bb:dd.f`` (sysfs form) of MTML's ``00000000:3A:00.0`` (``MTML_DEVICE_PCI_BUS_ID_FMT``) or ``3a:00.0``."""
    parts = text.strip().lower().split(":")
    if len(parts) == 2:
        return f"0000:{parts[0]}:{parts[1]}"
    if len(parts) != 3:
        return text.strip().lower()
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return text.strip().lower()


WORDS = DriverWords(
    "MTML",
    "the GPUs",
    from_tool="{problem}: Moore Threads GPUs are read from mthreads-gmi instead",
    nothing="{problem}, and {error}: this node reports no Moore Threads GPU",
    opened="Moore Threads MTML opened from {where}",
)


@dataclass
class NodeRuntime:
    """The MTML session and the GPUs of this node."""

    settings: MthreadsSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    gpus: list[MtGpu] = field(default_factory=list)
    topology: dict[tuple[str, str], int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """What the last read could not use (devices left out, malformed tool lines)."""
    reader: DriverReader[Mtml] = field(init=False)

    def __post_init__(self) -> None:
        self.reader = DriverReader(log, WORDS, lambda: Mtml.open(self.settings.mtml_library), ("mtml", "mthreads-gmi"))

    @property
    def mtml(self) -> Mtml | None:
        """The open MTML session, or None."""
        return self.reader.session

    @property
    def source(self) -> str:
        """Where the GPUs were last read from: ``mtml``, ``mthreads-gmi``, or empty (nowhere)."""
        return self.reader.source

    def read_gpus(self) -> list[MtGpu]:
        """This node's GPUs now, from MTML, else mthreads-gmi; none (said once) when neither works."""
        with self.lock:
            self.problems, self.topology = [], {}
            gpus = self.reader.read(self._from_mtml, self._from_gmi) or []
            for p in self.problems:
                log.error("%s", p)
            for g in gpus:
                if not g.healthy:
                    log.warning("Moore Threads GPU %d (%s) is reported unhealthy: %s", g.index, g.uuid, g.problem)
            self.gpus = [replace(g, bdf=sysfs_bdf(g.bdf)) if g.bdf else g for g in gpus]
            return self.gpus

    def _from_mtml(self, mtml: Mtml) -> list[MtGpu]:
        report = mtml.read()
        self.problems, self.topology = report.problems, report.topology
        return report.gpus

    def _from_gmi(self) -> list[MtGpu]:
        gmi = read_gpus(self.settings.mthreads_gmi)
        self.problems = gmi.problems
        return gmi.gpus

    def gpu_of(self, name: str) -> MtGpu:
        """The GPU a placement names: its UUID, or HAMi's capacity name ``<node>-mthreads-<index>``.

        On a node without MTML and mthreads-gmi (no driver: simulated devices, `hami demo`), a name ending in
        ``-<index>`` stands for that GPU, of unknown paths; with a driver, only its GPUs are served.

        :raises HamiError: no GPU of this node has that name.
        """

        def stand_in(name: str) -> MtGpu | None:
            index = trailing_index(name)
            if self.source or index is None:
                return None
            self.reader.said(logging.WARNING, "no Moore Threads driver on this node: GPU indices are taken from names")
            return MtGpu(index=index, uuid=name, name="")

        with self.lock:
            (gpu,) = devices_named(
                [name],
                self.gpus,
                self.read_gpus,
                what="Moore Threads GPU",
                name_of=lambda g: g.uuid,
                answers=lambda g, n: g.uuid == n or capacity_index(n, "mthreads") == g.index,
                stand_in=stand_in,
            )
            return gpu

    def readings(self) -> list[DeviceReading] | None:
        """What MTML reads from this node's GPUs now; None without MTML (mthreads-gmi gives none here), or when it
        fails this round (the monitor then shows the GPUs' figures unknown)."""
        with self.lock:
            if self.mtml is None:
                self.read_gpus()
            session = self.mtml
            if session is None:
                return None
            try:
                return session.readings()
            except MtmlError as exc:
                log.warning("cannot read the Moore Threads GPUs' figures this round: %s", exc)
                return None

    def gpus_of(self, names: Sequence[str]) -> list[MtGpu]:
        return [self.gpu_of(n) for n in names]


def runtime_for(settings: MthreadsSettings) -> NodeRuntime:
    """The node runtime attached to `settings`, created on first use."""
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))


def inventory(gpus: Sequence[MtGpu], topology: dict[tuple[str, str], int] | None = None) -> list[NodeInventory]:
    """The ``Mthreads`` inventory of these GPUs; ``[]`` without any."""
    devices = [
        Device(
            id=g.uuid,
            index=g.index,
            count=100,
            devmem=g.memory_total // (1024 * 1024),
            devcore=CORES_PER_GPU,
            type=type_of(g),
            numa=g.numa,
            health=g.healthy and g.memory_total > 0,
        )
        for g in gpus
    ]
    if not devices:
        return []
    annotations: dict[str, str] = {}
    if topology:
        uuids = [d.id for d in devices]
        scores = {a: {b: link_score(topology[(a, b)]) for b in uuids if (a, b) in topology} for a in uuids}
        annotations[SCORE_ANNOTATION] = encode_link_scores(scores)
    return [NodeInventory(kind="Mthreads", devices=tuple(devices), annotations=annotations)]


def discover(settings: MthreadsSettings) -> list[NodeInventory]:
    """This node's Moore Threads inventory; ``[]`` without a driver or a GPU."""
    runtime = runtime_for(settings)
    with runtime.lock:
        return inventory(runtime.read_gpus(), runtime.topology)
