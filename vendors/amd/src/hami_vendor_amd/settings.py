"""The `amd` section of the configuration: the node side's options (HAMi's AMD requests have no defaults).

Owns the names, defaults and validation of every AMD option:

* ``splitCount``: containers per GPU (HAMi's AMD device plugin registers 10);
* ``coreSplit``, how a container's ``amd.com/gpucores`` is held: ``cu-mask`` (HAMi's, the default: the node daemon
  gives the container its own compute units of each GPU, disjoint from every other container's, through ROCr's
  ``HSA_CU_MASK``) or ``time-slice`` (this project's isolation library charges each kernel's device time against the
  percentage; no mask);
* ``amdSmiLibrary`` (AMD SMI; default ROCm's ``/opt/rocm/lib/libamd_smi.so``, then the loader's search);
  ``sysfsRoot`` (a GPU's DRM nodes are found by its PCI address there, and ROCr's UUID of it in the KFD topology,
  ``class/kfd/kfd/topology/nodes``);
* ``drmFdinfo`` (core's `hami.drmfdinfo.DrmFdinfo`): the kernel's per-client statistics of amdgpu, a DRM driver
  that publishes them, read by the node daemon's backstop: on by default for the ``vram`` region, the memory the
  backstop judges a container by (AMD SMI gives no per-process memory here); no engines by default, as ROCm's
  compute runs on KFD user queues, which ``drm-engine-*`` does not count (name ``gfx``/``compute`` to publish the
  busy share of graphics and Vulkan work);
* the isolation library's ``hookPath`` (accounting and grant directories, and the CU-mask state, ``cu/``),
  ``libraryDir``, ``libhipLogLevel``.

A misspelled key is refused with its name. The node side's state (the AMD SMI session and the GPUs last read) is
kept with the settings object (core's `hami.vendorstate.VendorSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.drmfdinfo import DrmFdinfo
from hami.vendorstate import VendorSettings

__all__ = ["CU_MASK", "TIME_SLICE", "AmdSettings", "CoreSplit"]

CoreSplit = Literal["cu-mask", "time-slice"]
CU_MASK: Final = "cu-mask"
TIME_SLICE: Final = "time-slice"


class AmdSettings(VendorSettings):
    """The `amd` section of the configuration (keys in camelCase, or the fields' names: core's `VendorSettings`)."""

    split_count: int = Field(default=10, ge=1, le=64)
    core_split: CoreSplit = CU_MASK
    amd_smi_library: Path | None = None
    sysfs_root: Path = Path("/sys")
    hook_path: Path = Path("/usr/local/vgpu/amd")
    library_dir: str | None = None
    libhip_log_level: Literal["", "0", "1", "2", "3", "4"] = ""
    drm_fdinfo: DrmFdinfo = Field(
        default=DrmFdinfo(enabled=True, memory_regions=("vram",)),
        description="the kernel's amdgpu client statistics, for the backstop (hami.drmfdinfo)",
    )
