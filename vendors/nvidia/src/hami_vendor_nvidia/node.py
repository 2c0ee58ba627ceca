"""The node side's NVIDIA state: one NVML session shared by discovery, allocation and release.

Owns the session's lifecycle (opened on first use, reopened after the driver comes back, closed with
`NodeRuntime.close`), the "no NVML here" message (logged once, and once more when NVML appears), the health
memory (a GPU that raised a critical XID or was lost stays unhealthy until the daemon restarts, as with
NVIDIA's device plugin), and the record of MIG instances created for each pod, so release can destroy exactly
what allocation made. Also the compute processes on each GPU, for the node-side backstop (`device_processes`),
and what each GPU reads now (memory in use, busy share, power, temperature) for the node monitor (`device_readings`).

One runtime per settings object: `runtime_for(settings)` attaches it to the settings the `VendorPlugins` loaded,
so it lives as long as they do and two of them (two tests) never share one. Calls into NVML are serialized by the
session; compound MIG operations take `NodeRuntime.lock`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from hami.model import DeviceProcess, DeviceReading
from hami_vendor_nvidia.nvml import GpuInfo, MigInstance, Nvml, NvmlError, NvmlUnavailable
from hami_vendor_nvidia.settings import NvidiaSettings

__all__ = ["NodeRuntime", "Realized", "device_processes", "device_readings", "runtime_for"]

log = logging.getLogger("hami_vendor_nvidia")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Realized:
    """A MIG instance this node created for one device of one container."""

    container_index: int
    device_index: int
    instance: MigInstance


@dataclass
class NodeRuntime:
    """NVML session, GPU health and MIG bookkeeping of this node."""

    settings: NvidiaSettings
    lock: threading.RLock = field(default_factory=threading.RLock)
    nvml: Nvml | None = None
    unavailable_said: bool = False
    watched: bool = False
    unhealthy: dict[str, str] = field(default_factory=dict)
    """GPU UUID → why it is unhealthy."""
    last_memory: dict[str, int] = field(default_factory=dict)
    gpus: dict[str, GpuInfo] = field(default_factory=dict)
    """The GPUs of the last discovery round, by UUID."""
    created: dict[str, list[Realized]] = field(default_factory=dict)
    """Pod UID → MIG instances created for it and not yet destroyed."""

    def session(self) -> Nvml | None:
        """The open NVML session, opening it when needed; None (said once in the log) when there is no NVML."""
        with self.lock:
            if self.nvml is not None:
                return self.nvml
            try:
                self.nvml = Nvml.open(self.settings.nvml_library)
            except NvmlUnavailable as exc:
                if not self.unavailable_said:
                    log.warning("no NVML on this node, so it reports no NVIDIA devices: %s", exc)
                    self.unavailable_said = True
                return None
            except NvmlError as exc:
                log.error("NVML failed to initialize, reporting no NVIDIA devices this round: %s", exc)
                return None
            if self.unavailable_said:
                log.info("NVML is available again")
                self.unavailable_said = False
            log.info(
                "NVML opened: driver %s, %d GPU(s)%s",
                self.nvml.driver_version(),
                self.nvml.count,
                f" (library {self.settings.nvml_library})" if self.settings.nvml_library else "",
            )
            self.watched = False
            return self.nvml

    def drop_session(self, why: Exception) -> None:
        """Forget a session that failed as a whole; the next call opens a new one."""
        with self.lock:
            log.error("NVML session failed, it will be reopened: %s", why)
            if self.nvml is not None:
                self.nvml.close()
            self.nvml = None

    def mark_unhealthy(self, uuid: str, why: str) -> None:
        if uuid not in self.unhealthy:
            log.warning("GPU %s is unhealthy: %s", uuid, why)
            self.unhealthy[uuid] = why

    def known_gpus(self) -> dict[str, GpuInfo]:
        """The GPUs by UUID: those of the last discovery, or read from NVML when there was none yet."""
        if not self.gpus:
            nvml = self.session()
            if nvml is not None:
                self.gpus = {g.uuid: g for g in nvml.gpus()}
        return self.gpus

    def gpu_index(self, uuid: str) -> int | None:
        """NVML's index of the GPU with `uuid`."""
        known = self.known_gpus().get(uuid)
        return None if known is None else known.index

    def close(self) -> None:
        with self.lock:
            if self.nvml is not None:
                self.nvml.close()
                self.nvml = None


def runtime_for(settings: NvidiaSettings) -> NodeRuntime:
    """The node runtime attached to `settings` (core's `hami.vendorstate.VendorSettings`), created on first use."""
    return settings.runtime_of(NodeRuntime, lambda: NodeRuntime(settings))


def _per_gpu(settings: NvidiaSettings, what: str, read: Callable[[Nvml, GpuInfo], Iterable[T]]) -> list[T] | None:
    """`read` over each GPU NVML still sees (lost ones skipped), its answers joined; None without NVML, or when NVML
    fails this round (the caller then says nothing rather than something half-read)."""
    runtime = runtime_for(settings)
    nvml = runtime.session()
    if nvml is None:
        return None
    found: list[T] = []
    try:
        for gpu in runtime.known_gpus().values():
            if not gpu.lost:
                found += read(nvml, gpu)
    except NvmlError as exc:
        log.warning("cannot read the GPUs' %s this round: %s", what, exc)
        return None
    return found


def device_processes(settings: NvidiaSettings) -> list[DeviceProcess] | None:
    """Each compute process on this node's GPUs and the memory NVML counts for it (for the backstop)."""

    def read(nvml: Nvml, gpu: GpuInfo) -> list[DeviceProcess]:
        if gpu.mig_enabled:  # MIG: NVML reports processes per GPU instance, not per GPU
            return []
        return [
            DeviceProcess(device_uuid=gpu.uuid, pid=pid, used_bytes=used)
            for pid, used in nvml.compute_processes(gpu.index)
        ]

    return _per_gpu(settings, "compute processes", read)


def device_readings(settings: NvidiaSettings) -> list[DeviceReading] | None:
    """What NVML reads from each of this node's GPUs now, for the node monitor. A MIG-enabled GPU is read as a
    whole (its instances have no figures of their own here)."""

    def read(nvml: Nvml, gpu: GpuInfo) -> list[DeviceReading]:
        r = nvml.readings(gpu.index)
        driver = nvml.driver_version()
        return [
            DeviceReading(
                device_uuid=gpu.uuid,
                memory_used_bytes=r.memory_used,
                memory_total_bytes=r.memory_total,
                utilization_percent=r.utilization,
                power_watts=r.power_watts,
                temperature_celsius=r.temperature,
                driver_version="" if driver == "unknown" else driver,
            )
        ]

    return _per_gpu(settings, "figures", read)
