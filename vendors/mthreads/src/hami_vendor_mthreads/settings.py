"""The `mthreads` section of the configuration: HAMi's request default and the node side's options.

Owns the names, defaults and validation of every Moore Threads option:

* cluster-wide: ``defaultCores``, the cores (sixteenths of a GPU) given to a container that names memory without
  cores (HAMi gives 0);
* node side: ``mtmlLibrary`` (``libmtml.so``; empty: the dynamic loader's, then MUSA's directories),
  ``mthreadsGmi`` (the tool read when MTML cannot be loaded), ``driverCapabilities`` (what the container toolkit
  is told to mount, ``MTHREADS_DRIVER_CAPABILITIES``, ``compute,utility``), ``sysfsRoot`` (where a GPU's DRM
  nodes are found by its PCI address when MTML cannot name them).

A misspelled key is refused with its name. The node side's state (the MTML session and the GPUs last read) is kept
with the settings object (`hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import ConfigDict, Field

from hami.vendorstate import RuntimeSettings

__all__ = ["CORES_PER_GPU", "CORE_UNIT", "SGPU", "SOFT", "MthreadsSettings", "SharingMode"]

CORES_PER_GPU = 16
CORE_UNIT = "sixteenths of a GPU"
SharingMode = Literal["sgpu", "hami-core"]
SGPU: Final = "sgpu"
SOFT: Final = "hami-core"


class MthreadsSettings(RuntimeSettings):
    """The `mthreads` section of the configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    default_cores: int = Field(
        default=0,
        ge=0,
        le=CORES_PER_GPU,
        alias="defaultCores",
        description=f"cores ({CORE_UNIT}) when memory is given without cores",
    )
    mtml_library: Path | None = Field(default=None, alias="mtmlLibrary", description="path of libmtml.so")
    mthreads_gmi: str = Field(default="mthreads-gmi", min_length=1, alias="mthreadsGmi")
    driver_capabilities: str = Field(
        default="compute,utility",
        pattern=r"^(all|[a-z]+(,[a-z]+)*)$",
        alias="driverCapabilities",
        description="MTHREADS_DRIVER_CAPABILITIES given to the container",
    )
    sysfs_root: Path = Field(default=Path("/sys"), alias="sysfsRoot")
    sharing_mode: SharingMode = Field(default=SGPU, alias="sharingMode")
    hook_path: Path = Field(default=Path("/usr/local/vgpu/mthreads"), alias="hookPath")
    library_dir: Path | None = Field(default=None, alias="libraryDir")
    libvmusa_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(default="", alias="libvmusaLogLevel")
