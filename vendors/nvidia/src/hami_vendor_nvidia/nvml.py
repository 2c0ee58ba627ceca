"""The NVIDIA driver binding: the one module of this package that touches NVML (through pynvml).

Owns an NVML session (`Nvml`) and turns what NVML answers into plain, typed values: `GpuInfo` (UUID, index,
name, memory, PCI bus, MIG mode and MIG profiles with their legal placements), `NvLink` (the enabled links of a
GPU and what is at their far end), XID events (`XidEvent`), and MIG instances (`MigInstance`) that it creates,
lists and destroys. Every other module of the vendor works on these values, so tests and the rest of the code
never see a pynvml handle, and a fake ``libnvidia-ml.so.1`` can stand in for the driver.

Loading: pynvml opens ``libnvidia-ml.so.1`` through the dynamic loader. When a library path is configured
(`Nvml.open(library=...)`), that file is loaded first with ``RTLD_GLOBAL``; the loader then resolves pynvml's
request for ``libnvidia-ml.so.1`` to it by its SONAME, so the same code path serves the real driver, a driver
installed in a non-standard directory, and the test suite's fake. A missing library or driver raises
`NvmlUnavailable` (never a pynvml exception); other NVML failures raise `NvmlError` with the NVML code.

It must not decide anything: no scaling, no health policy, no annotation formats. Calls are serialized by a
lock, since the node daemon calls discovery and allocation from different threads.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from hami.vendordriver import DriverError, DriverUnavailable

__all__ = [
    "GpuInfo",
    "MigInstance",
    "MigProfileInfo",
    "NvLink",
    "Nvml",
    "NvmlError",
    "NvmlUnavailable",
    "XidEvent",
    "P2P_LEVELS",
]

T = TypeVar("T")

ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
ERROR_INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
ERROR_NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
ERROR_IN_USE = pynvml.NVML_ERROR_IN_USE
ERROR_GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
ERROR_TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
ERROR_INSUFFICIENT_RESOURCES = pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
_UNAVAILABLE = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_NO_PERMISSION,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
}
NO_INSTANCE = 0xFFFFFFFF

P2P_LEVELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "same board",
    pynvml.NVML_TOPOLOGY_SINGLE: "single PCIe switch",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "multiple PCIe switches",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "host bridge",
    pynvml.NVML_TOPOLOGY_NODE: "same CPU",
    pynvml.NVML_TOPOLOGY_SYSTEM: "across CPUs",
}
"""NVML's `nvmlGpuTopologyLevel_t` values (closest common ancestor of two GPUs), nearest first."""

_GI_PROFILE_IDS = range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT)
_CI_PROFILE_IDS = range(pynvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
_XID_EVENTS = pynvml.nvmlEventTypeXidCriticalError


class NvmlError(DriverError):
    """An NVML call failed. `code` is NVML's return code, `call` the function that failed."""

    def describe(self, call: str, code: int | None, message: str) -> str:
        return f"NVML {call}: {message} (NVML error {code})"


class NvmlUnavailable(NvmlError, DriverUnavailable):
    """There is no usable NVML on this host: the library or the kernel driver is missing."""


@dataclass(frozen=True, slots=True)
class MigProfileInfo:
    """A GPU instance profile NVML reports for a GPU in MIG mode, with the placements it may take."""

    profile_id: int
    name: str
    """The profile's short name, e.g. ``1g.10gb`` (NVML's ``MIG 1g.10gb`` without the prefix)."""
    slices: int
    """Compute slices (the `g` of the name)."""
    instances: int
    """How many instances of this profile fit on an empty GPU."""
    multiprocessors: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]
    """Legal (start, size) placements in memory slices, in NVML's order."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One physical GPU as NVML describes it."""

    index: int
    uuid: str
    name: str
    memory_mib: int | None
    """Total memory in MiB; None when NVML cannot say (a lost GPU, a unified-memory GPU)."""
    bus_id: str
    """PCI bus id as NVML writes it, e.g. ``00000000:3B:00.0``."""
    mig_enabled: bool
    mig_profiles: tuple[MigProfileInfo, ...]
    lost: bool = False
    """NVML answered "GPU is lost" for this GPU."""


@dataclass(frozen=True, slots=True)
class NvLink:
    """One enabled NVLink of a GPU and what its far end is."""

    link: int
    remote_bus_id: str
    to_switch: bool


@dataclass(frozen=True, slots=True)
class XidEvent:
    """A critical XID error reported by the driver for a GPU (and a MIG instance of it, when known)."""

    gpu_index: int
    xid: int
    gpu_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A GPU instance (with its compute instance, when one exists) on a GPU in MIG mode."""

    gpu_index: int
    gpu_uuid: str
    profile_id: int
    profile: str
    start: int
    size: int
    gpu_instance_id: int
    compute_instance_id: int | None
    uuid: str
    """The MIG device UUID (``MIG-…``), empty while the instance has no compute instance."""


def _short_profile_name(raw: bytes | str) -> str:
    name = raw.decode() if isinstance(raw, bytes) else raw
    return name.removeprefix("MIG ").strip()


def bus_id_of(pci: Any) -> str:
    raw = pci.busId
    return (raw.decode() if isinstance(raw, bytes) else str(raw)).strip("\x00")


_loaded_libraries: dict[str, ctypes.CDLL] = {}


class Nvml:
    """An open NVML session. Use `Nvml.open`; `close` shuts NVML down again (the library stays loaded)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._open = True
        self._events: Any = None
        self._handles: list[Any] = []

    # ------------------------------------------------------------------------------------------ session

    @classmethod
    def open(cls, library: Path | None = None) -> Nvml:
        """Initialize NVML, loading `library` first when given.

        :raises NvmlUnavailable: the library cannot be loaded or the driver is not there.
        """
        if library is not None:
            key = str(library)
            if key not in _loaded_libraries:
                try:
                    _loaded_libraries[key] = ctypes.CDLL(key, mode=ctypes.RTLD_GLOBAL)
                except OSError as exc:
                    raise NvmlUnavailable("load", pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, str(exc)) from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            code = int(exc.value)
            kind = NvmlUnavailable if code in _UNAVAILABLE else NvmlError
            raise kind("nvmlInit", code, _message(exc)) from None
        session = cls()
        try:
            count = session._call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
            session._handles = [
                session._call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, i) for i in range(count)
            ]
        except NvmlError:
            session.close()
            raise
        return session

    def close(self) -> None:
        with self._lock:
            if not self._open:
                return
            if self._events is not None:
                with suppress(pynvml.NVMLError):
                    pynvml.nvmlEventSetFree(self._events)
                self._events = None
            self._open = False
            with suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, name: str, fn: Callable[..., T], *args: Any) -> T:
        with self._lock:
            if not self._open:
                raise NvmlError(name, pynvml.NVML_ERROR_UNINITIALIZED, "the NVML session is closed")
            try:
                return fn(*args)
            except pynvml.NVMLError as exc:
                raise NvmlError(name, int(exc.value), _message(exc)) from None

    def _handle(self, index: int) -> Any:
        if not 0 <= index < len(self._handles):
            raise NvmlError("handle", ERROR_INVALID_ARGUMENT, f"there is no GPU with index {index}")
        return self._handles[index]

    @property
    def count(self) -> int:
        return len(self._handles)

    def driver_version(self) -> str:
        try:
            value = self._call("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion)
        except NvmlError:
            return "unknown"
        return str(value)

    # ------------------------------------------------------------------------------------------ GPUs

    def gpu(self, index: int) -> GpuInfo:
        """What NVML says about GPU `index`. A lost GPU is returned with ``lost=True`` and no memory."""
        h = self._handle(index)
        uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h))
        name = str(self._call("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, h))
        nv_index = int(self._call("nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, h))
        bus = bus_id_of(self._call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, h))
        memory: int | None = None
        lost = False
        try:
            info = self._call("nvmlDeviceGetMemoryInfo", pynvml.nvmlDeviceGetMemoryInfo, h)
            memory = int(info.total) // (1024 * 1024)
        except NvmlError as exc:
            if exc.code == ERROR_GPU_IS_LOST:
                lost = True
            elif exc.code != ERROR_NOT_SUPPORTED:
                raise
        mig = False
        try:
            current, _pending = self._call("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, h)
            mig = int(current) == pynvml.NVML_DEVICE_MIG_ENABLE
        except NvmlError as exc:
            if exc.code not in (ERROR_NOT_SUPPORTED, ERROR_GPU_IS_LOST):
                raise
        profiles = self._mig_profiles(h) if mig and not lost else ()
        return GpuInfo(nv_index, uuid, name, memory, bus, mig, profiles, lost)

    def gpus(self) -> list[GpuInfo]:
        return [self.gpu(i) for i in range(self.count)]

    def compute_processes(self, index: int) -> list[tuple[int, int]]:
        """(pid, device memory in bytes) of each compute process on GPU `index`
        (``nvmlDeviceGetComputeRunningProcesses_v3``); a figure NVML cannot give (Windows' WDDM) counts as 0."""
        h = self._handle(index)
        found = self._call("nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses, h)
        return [(int(p.pid), int(p.usedGpuMemory or 0)) for p in found]

    def _mig_profiles(self, h: Any) -> tuple[MigProfileInfo, ...]:
        out = []
        for pid in _GI_PROFILE_IDS:
            try:
                info = self._call(
                    "nvmlDeviceGetGpuInstanceProfileInfo", pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, pid
                )
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    continue
                raise
            out.append(
                MigProfileInfo(
                    profile_id=int(info.id),
                    name=_short_profile_name(info.name),
                    slices=int(info.sliceCount),
                    instances=int(info.instanceCount),
                    multiprocessors=int(info.multiprocessorCount),
                    memory_mib=int(info.memorySizeMB),
                    placements=self._placements(h, int(info.id)),
                )
            )
        return tuple(out)

    def _placements(self, h: Any, profile_id: int) -> tuple[tuple[int, int], ...]:
        count = ctypes.c_uint(0)
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            h,
            profile_id,
            None,
            ctypes.byref(count),
        )
        if not count.value:
            return ()
        array = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._call(
            "nvmlDeviceGetGpuInstancePossiblePlacements",
            pynvml.nvmlDeviceGetGpuInstancePossiblePlacements,
            h,
            profile_id,
            array,
            ctypes.byref(count),
        )
        return tuple((int(p.start), int(p.size)) for p in array[: count.value])

    # ------------------------------------------------------------------------------------------ topology

    def p2p_level(self, a: int, b: int) -> int | None:
        """NVML's closest common ancestor of GPUs `a` and `b` (a `P2P_LEVELS` key), None when unknown."""
        try:
            level = self._call(
                "nvmlDeviceGetTopologyCommonAncestor",
                pynvml.nvmlDeviceGetTopologyCommonAncestor,
                self._handle(a),
                self._handle(b),
            )
        except NvmlError as exc:
            if exc.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                return None
            raise
        return int(level)

    def nvlinks(self, index: int) -> list[NvLink]:
        """The enabled NVLinks of GPU `index`; empty when the GPU has none."""
        h = self._handle(index)
        links = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self._call("nvmlDeviceGetNvLinkState", pynvml.nvmlDeviceGetNvLinkState, h, link)
                if int(state) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                pci = self._call("nvmlDeviceGetNvLinkRemotePciInfo", pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                kind = self._call(
                    "nvmlDeviceGetNvLinkRemoteDeviceType", pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link
                )
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    if exc.code == ERROR_NOT_SUPPORTED and link == 0:
                        return []
                    continue
                raise
            links.append(NvLink(link, bus_id_of(pci), int(kind) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH))
        return links

    # ------------------------------------------------------------------------------------------ health

    def watch_xids(self) -> list[int]:
        """Register for critical XID events on every GPU that supports them; returns the indexes watched."""
        with self._lock:
            if self._events is None:
                self._events = self._call("nvmlEventSetCreate", pynvml.nvmlEventSetCreate)
            watched = []
            for i, h in enumerate(self._handles):
                try:
                    supported = int(
                        self._call("nvmlDeviceGetSupportedEventTypes", pynvml.nvmlDeviceGetSupportedEventTypes, h)
                    )
                    if supported & _XID_EVENTS:
                        self._call(
                            "nvmlDeviceRegisterEvents", pynvml.nvmlDeviceRegisterEvents, h, _XID_EVENTS, self._events
                        )
                        watched.append(i)
                except NvmlError as exc:
                    if exc.code not in (ERROR_NOT_SUPPORTED, ERROR_GPU_IS_LOST):
                        raise
            return watched

    def poll_xids(self) -> list[XidEvent]:
        """The XID events that arrived since the last poll, without waiting."""
        with self._lock:
            if self._events is None:
                return []
            addresses = {ctypes.cast(h, ctypes.c_void_p).value: i for i, h in enumerate(self._handles)}
            events: list[XidEvent] = []
            while True:
                try:
                    data = self._call("nvmlEventSetWait", pynvml.nvmlEventSetWait, self._events, 0)
                except NvmlError as exc:
                    if exc.code == ERROR_TIMEOUT:
                        return events
                    raise
                if not int(data.eventType) & _XID_EVENTS:
                    continue
                index = addresses.get(ctypes.cast(data.device, ctypes.c_void_p).value)
                if index is None:
                    continue
                gi = int(data.gpuInstanceId)
                events.append(XidEvent(index, int(data.eventData), None if gi == NO_INSTANCE else gi))

    # ------------------------------------------------------------------------------------------ MIG

    def mig_instances(self, index: int) -> list[MigInstance]:
        """Every GPU instance that exists on GPU `index`, in placement order."""
        h = self._handle(index)
        uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h))
        names = {p.profile_id: p.name for p in self._mig_profiles(h)}
        found = []
        for pid in names:
            for gi in self._gpu_instances(h, pid):
                found.append(self._describe(index, uuid, gi, names))
        return sorted(found, key=lambda m: (m.start, m.size))

    def _gpu_instances(self, h: Any, profile_id: int) -> list[Any]:
        count = ctypes.c_uint(0)
        array = (pynvml.c_nvmlGpuInstance_t * 16)()
        count.value = 16
        self._call(
            "nvmlDeviceGetGpuInstances", pynvml.nvmlDeviceGetGpuInstances, h, profile_id, array, ctypes.byref(count)
        )
        return list(array[: count.value])

    def _compute_instance(self, gi: Any) -> Any | None:
        for cpid in _CI_PROFILE_IDS:
            count = ctypes.c_uint(0)
            array = (pynvml.c_nvmlComputeInstance_t * 8)()
            count.value = 8
            try:
                self._call(
                    "nvmlGpuInstanceGetComputeInstances",
                    pynvml.nvmlGpuInstanceGetComputeInstances,
                    gi,
                    cpid,
                    array,
                    ctypes.byref(count),
                )
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    continue
                raise
            if count.value:
                return array[0]
        return None

    def _describe(self, index: int, gpu_uuid: str, gi: Any, names: dict[int, str]) -> MigInstance:
        info = self._call("nvmlGpuInstanceGetInfo", pynvml.nvmlGpuInstanceGetInfo, gi)
        gi_id = int(info.id)
        ci = self._compute_instance(gi)
        ci_id: int | None = None
        mig_uuid = ""
        if ci is not None:
            ci_id = int(self._call("nvmlComputeInstanceGetInfo", pynvml.nvmlComputeInstanceGetInfo, ci).id)
            mig_uuid = self._mig_uuid(self._handle(index), gi_id, ci_id)
        return MigInstance(
            gpu_index=index,
            gpu_uuid=gpu_uuid,
            profile_id=int(info.profileId),
            profile=names.get(int(info.profileId), str(int(info.profileId))),
            start=int(info.placement.start),
            size=int(info.placement.size),
            gpu_instance_id=gi_id,
            compute_instance_id=ci_id,
            uuid=mig_uuid,
        )

    def _mig_uuid(self, h: Any, gi_id: int, ci_id: int) -> str:
        limit = int(self._call("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, h))
        for i in range(limit):
            try:
                mig = self._call(
                    "nvmlDeviceGetMigDeviceHandleByIndex", pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, i
                )
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_FOUND, ERROR_INVALID_ARGUMENT):
                    continue
                raise
            if int(self._call("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig)) != gi_id:
                continue
            if int(self._call("nvmlDeviceGetComputeInstanceId", pynvml.nvmlDeviceGetComputeInstanceId, mig)) != ci_id:
                continue
            return str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, mig))
        return ""

    def create_mig(self, index: int, profile_id: int, start: int, size: int) -> MigInstance:
        """Create a GPU instance of `profile_id` at exactly (`start`, `size`) on GPU `index`, and one compute
        instance spanning it. On failure nothing is left behind.

        :raises NvmlError: NVML refused (an overlapping instance, an illegal placement, MIG not enabled).
        """
        with self._lock:
            h = self._handle(index)
            placement = pynvml.c_nvmlGpuInstancePlacement_t()
            placement.start = start
            placement.size = size
            gi = self._call(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                pynvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                h,
                profile_id,
                ctypes.byref(placement),
            )
            try:
                slices = int(
                    self._call(
                        "nvmlDeviceGetGpuInstanceProfileInfo", pynvml.nvmlDeviceGetGpuInstanceProfileInfo, h, profile_id
                    ).sliceCount
                )
                ci_profile = self._full_compute_profile(gi, slices)
                self._call(
                    "nvmlGpuInstanceCreateComputeInstance", pynvml.nvmlGpuInstanceCreateComputeInstance, gi, ci_profile
                )
            except NvmlError:
                self._call("nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, gi)
                raise
            uuid = str(self._call("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, h))
            names = {p.profile_id: p.name for p in self._mig_profiles(h)}
            return self._describe(index, uuid, gi, names)

    def _full_compute_profile(self, gi: Any, slices: int) -> int:
        """The compute instance profile that spans the whole GPU instance."""
        for cpid in _CI_PROFILE_IDS:
            try:
                info = self._call(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                    gi,
                    cpid,
                    pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                )
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_SUPPORTED, ERROR_INVALID_ARGUMENT):
                    continue
                raise
            if int(info.sliceCount) == slices:
                return int(info.id)
        raise NvmlError("nvmlGpuInstanceGetComputeInstanceProfileInfo", ERROR_NOT_SUPPORTED, "no full compute profile")

    def destroy_mig(self, index: int, gpu_instance_id: int) -> bool:
        """Destroy GPU instance `gpu_instance_id` of GPU `index` and its compute instances.

        :returns: False when there was no such instance (already destroyed).
        :raises NvmlError: NVML refused, e.g. ``ERROR_IN_USE`` while processes still run on it.
        """
        with self._lock:
            h = self._handle(index)
            try:
                gi = self._call("nvmlDeviceGetGpuInstanceById", pynvml.nvmlDeviceGetGpuInstanceById, h, gpu_instance_id)
            except NvmlError as exc:
                if exc.code in (ERROR_NOT_FOUND, ERROR_INVALID_ARGUMENT):
                    return False
                raise
            while (ci := self._compute_instance(gi)) is not None:
                self._call("nvmlComputeInstanceDestroy", pynvml.nvmlComputeInstanceDestroy, ci)
            self._call("nvmlGpuInstanceDestroy", pynvml.nvmlGpuInstanceDestroy, gi)
            return True

    @contextmanager
    def locked(self) -> Iterator[Nvml]:
        """Hold the session's lock across several calls (read occupancy, then create)."""
        with self._lock:
            yield self


def _message(exc: Any) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml builds the text through nvmlErrorString, which may itself fail
        return f"NVML error {getattr(exc, 'value', '?')}"
