"""The `hygon` section of the configuration: HAMi's request defaults plus the node side's options.

Owns the names, defaults and validation of every Hygon option:

* cluster-wide: ``defaultMem`` and ``defaultCores`` (HAMi's request defaults);
* node side: ``dcuMode``, how this node shares a DCU: ``vdcu`` (HAMi's, the default: Hygon's driver-level
  virtual DCU, described by a ``vdev*.conf`` file and, where DMI is present, created through it) or ``hami-core``
  (this project's isolation library ``libvdcu.so`` over the HIP runtime); ``splitCount`` (containers per DCU,
  HAMi's plugin registers 4); the libraries and tool to discover with (``rocmSmiLibrary``, ``dmiLibrary``,
  ``hySmi``); the host paths HAMi's DCU plugin uses (``vdevDir`` ``/usr/local/vgpu/dcu``, ``exporterDir``
  ``/etc/vdev``, ``hygonDriverPath`` (``$HYGONPATH``), ``hyhalPath`` ``/opt/hyhal``; ``writableMounts``, HAMi's
  read-write mounts of them, off by default), the sysfs root where a DCU's
  DRM nodes are found by its PCI address, and the soft mode's (``hookPath``, ``libraryDir``, ``libvdcuLogLevel``).

A misspelled key is refused with its name. The node side's state (the sessions and the devices last read) is kept
with the settings object (core's `hami.vendorstate.RuntimeSettings`), never validated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from pydantic import AliasChoices, Field

from hami.requests import ShareDefaults
from hami.vendorstate import RuntimeSettings

__all__ = ["SOFT", "VDCU", "DcuMode", "HygonSettings"]

DcuMode = Literal["vdcu", "hami-core"]
VDCU: Final = "vdcu"
SOFT: Final = "hami-core"


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class HygonSettings(ShareDefaults, RuntimeSettings):
    """The `hygon` section of the configuration."""

    dcu_mode: DcuMode = Field(default=VDCU, validation_alias=_alias("dcuMode", "dcu_mode"))
    split_count: int = Field(default=4, ge=1, le=64, validation_alias=_alias("splitCount", "split_count"))
    rocm_smi_library: Path | None = Field(default=None, validation_alias=_alias("rocmSmiLibrary", "rocm_smi_library"))
    dmi_library: Path | None = Field(default=None, validation_alias=_alias("dmiLibrary", "dmi_library"))
    hy_smi: str = Field(default="hy-smi", min_length=1, validation_alias=_alias("hySmi", "hy_smi"))
    vdev_dir: Path = Field(default=Path("/usr/local/vgpu/dcu"), validation_alias=_alias("vdevDir", "vdev_dir"))
    exporter_dir: Path = Field(default=Path("/etc/vdev"), validation_alias=_alias("exporterDir", "exporter_dir"))
    hygon_driver_path: str = Field(
        default_factory=lambda: os.environ.get("HYGONPATH", "/opt/hygondriver"),
        validation_alias=_alias("hygonDriverPath", "hygon_driver_path"),
    )
    hyhal_path: str = Field(default="/opt/hyhal", validation_alias=_alias("hyhalPath", "hyhal_path"))
    writable_mounts: bool = Field(default=False, validation_alias=_alias("writableMounts", "writable_mounts"))
    """Mount the vdev directory, $HYGONPATH and /opt/hyhal read-write, as HAMi's plugin does (default: read-only:
    a tenant could otherwise rewrite its vDCU's file or the host's driver files)."""
    sysfs_root: Path = Field(default=Path("/sys"), validation_alias=_alias("sysfsRoot", "sysfs_root"))
    hook_path: Path = Field(
        default=Path("/usr/local/vgpu/dcu-hami-core"), validation_alias=_alias("hookPath", "hook_path")
    )
    library_dir: Path | None = Field(default=None, validation_alias=_alias("libraryDir", "library_dir"))
    libvdcu_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(
        default="", validation_alias=_alias("libvdcuLogLevel", "libvdcu_log_level")
    )

    @property
    def containers_dir(self) -> Path:
        """``<hookPath>/containers``: one accounting directory per soft-mode container."""
        return self.hook_path / "containers"
