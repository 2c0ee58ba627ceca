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
  DRM nodes are found by its PCI address, and the soft mode's (``hookPath``, ``libraryDir``, ``libvdcuLogLevel``);
  ``drmFdinfo`` (core's `hami.drmfdinfo.DrmFdinfo`, off by default): the kernel's per-client statistics of the DCU
  driver, which is amdgpu-derived but whose fdinfo keys and DRM name are not documented: turned on, ``drivers`` must
  name what its fdinfo prints as ``drm-driver``. Its memory serves the backstop only where ROCm SMI gives no
  per-process figure (DCUs read from ``hy-smi``); its engines do not see DTK's compute, which runs on KFD queues.

Read as every vendor's section is (core's `hami.requests.ShareDefaults` on `hami.vendorstate.VendorSettings`):
HAMi's camelCase or the field's name, a misspelled key refused with its name. The node side's state (the sessions
and the devices last read) is kept with the settings object, never validated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from pydantic import Field

from hami.drmfdinfo import DrmFdinfo
from hami.requests import ShareDefaults

__all__ = ["SOFT", "VDCU", "DcuMode", "HygonSettings"]

DcuMode = Literal["vdcu", "hami-core"]
VDCU: Final = "vdcu"
SOFT: Final = "hami-core"


class HygonSettings(ShareDefaults):
    """The `hygon` section of the configuration."""

    dcu_mode: DcuMode = VDCU
    split_count: int = Field(default=4, ge=1, le=64)
    rocm_smi_library: Path | None = None
    dmi_library: Path | None = None
    hy_smi: str = Field(default="hy-smi", min_length=1)
    vdev_dir: Path = Path("/usr/local/vgpu/dcu")
    exporter_dir: Path = Path("/etc/vdev")
    hygon_driver_path: str = Field(
        default_factory=lambda: os.environ.get("HYGONPATH", "/opt/hygondriver"),
    )
    hyhal_path: str = "/opt/hyhal"
    writable_mounts: bool = False
    """Mount the vdev directory, $HYGONPATH and /opt/hyhal read-write, as HAMi's plugin does (default: read-only:
    a tenant could otherwise rewrite its vDCU's file or the host's driver files)."""
    sysfs_root: Path = Path("/sys")
    hook_path: Path = Field(default=Path("/usr/local/vgpu/dcu-hami-core"))
    library_dir: Path | None = None
    libvdcu_log_level: Literal["", "0", "1", "2", "3", "4"] = Field(default="")
    drm_fdinfo: DrmFdinfo = Field(
        default=DrmFdinfo(), description="the kernel's DCU client statistics, for the backstop (hami.drmfdinfo)"
    )

    @property
    def containers_dir(self) -> Path:
        """``<hookPath>/containers``: one accounting directory per soft-mode container."""
        return self.hook_path / "containers"
