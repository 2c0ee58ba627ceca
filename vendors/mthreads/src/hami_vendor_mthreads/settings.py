"""The `mthreads` section of the configuration: HAMi's request default and the node side's options.

Owns the names, defaults and validation of every Moore Threads option:

* cluster-wide: ``defaultCores``, the cores (sixteenths of a GPU) given to a container that names memory without
  cores (HAMi gives 0);
* node side: ``mtmlLibrary`` (``libmtml.so``; empty: the dynamic loader's, then MUSA's directories),
  ``mthreadsGmi`` (the tool read when MTML cannot be loaded), ``driverCapabilities`` (what the container toolkit
  is told to mount, ``MTHREADS_DRIVER_CAPABILITIES``, ``compute,utility``), ``sysfsRoot`` (where a GPU's DRM
  nodes are found by its PCI address when MTML cannot name them), ``drmFdinfo`` (core's `hami.drmfdinfo.DrmFdinfo`,
  off by default: whether mtgpu publishes the kernel's per-client statistics is not documented, and the driver's
  public source registers no ``show_fdinfo``; on a driver that does, name its memory region to give the node
  daemon's backstop the containers' memory, which MTML has no call for).

Read as every vendor's section is (core's `hami.vendorstate.VendorSettings`): HAMi's camelCase or the field's name,
a misspelled key refused with its name. (HAMi gives Moore Threads no ``defaultMem``: memory is always asked.) The
node side's state (the MTML session and the GPUs last read) is kept with the settings object, never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.drmfdinfo import DrmFdinfo
from hami.vendorstate import VendorSettings

__all__ = ["CORES_PER_GPU", "CORE_UNIT", "SGPU", "SOFT", "MthreadsSettings", "SharingMode"]

CORES_PER_GPU = 16
CORE_UNIT = "sixteenths of a GPU"
SharingMode = Literal["sgpu", "hami-core"]
SGPU: Final = "sgpu"
SOFT: Final = "hami-core"


class MthreadsSettings(VendorSettings):
    """The `mthreads` section of the configuration."""

    default_cores: int = Field(
        default=0,
        ge=0,
        le=CORES_PER_GPU,
        description=f"cores ({CORE_UNIT}) when memory is given without cores",
    )
    mtml_library: Path | None = Field(default=None, description="path of libmtml.so")
    mthreads_gmi: str = Field(default="mthreads-gmi", min_length=1)
    driver_capabilities: str = Field(
        default="compute,utility",
        pattern=r"^(all|[a-z]+(,[a-z]+)*)$",
        description="MTHREADS_DRIVER_CAPABILITIES given to the container",
    )
    sysfs_root: Path = Path("/sys")
    sharing_mode: SharingMode = SGPU
    hook_path: Path = Path("/usr/local/vgpu/mthreads")
    library_dir: Path | None = None
    libvmusa_log_level: Literal["", "0", "1", "2", "3", "4"] = ""
    drm_fdinfo: DrmFdinfo = Field(
        default=DrmFdinfo(), description="the kernel's mtgpu client statistics, for the backstop (hami.drmfdinfo)"
    )
