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
* the isolation library's ``hookPath`` (accounting and grant directories, and the CU-mask state, ``cu/``),
  ``libraryDir``, ``libhipLogLevel``.

A misspelled key is refused with its name. The node side's state (the AMD SMI session and the GPUs last read) is
kept with the settings object (core's `hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final, Literal

from pydantic import AliasChoices, ConfigDict, Field

from hami.vendorstate import RuntimeSettings

__all__ = ["CU_MASK", "TIME_SLICE", "AmdSettings", "CoreSplit"]

CoreSplit = Literal["cu-mask", "time-slice"]
CU_MASK: Final = "cu-mask"
TIME_SLICE: Final = "time-slice"


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class AmdSettings(RuntimeSettings):
    """The `amd` section of the configuration."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    split_count: int = Field(default=10, ge=1, le=64, validation_alias=_alias("splitCount", "split_count"))
    core_split: CoreSplit = Field(default=CU_MASK, validation_alias=_alias("coreSplit", "core_split"))
    amd_smi_library: Path | None = Field(default=None, validation_alias=_alias("amdSmiLibrary", "amd_smi_library"))
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=_alias("sysfsRoot", "sysfs_root"))
    hook_path: Path = Field(default=Path("/usr/local/vgpu/amd"), validation_alias=_alias("hookPath", "hook_path"))
    library_dir: str | None = Field(default=None, validation_alias=_alias("libraryDir", "library_dir"))
    libhip_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(
        default="", validation_alias=_alias("libhipLogLevel", "libhip_log_level")
    )
